//! The object-backed device: manifest, lease, per-object cache slots, write-back.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::{Future, IntoFuture};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use blockdev::{
    BlockDevice, BlockError, BlockErrorKind, BlockResult, Caps, Extent, ExtentFlags, Geometry, WriteFlags,
    WritebackLatch,
};
use futures::StreamExt;
use opendal::{Buffer, ErrorKind as DalKind, Operator};

use crate::locator::{Locator, Service};
use crate::{BLOCK, DATA, LEASE, MANIFEST};

/// How to open an object-backed volume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Refuse writes and take no lease.
    pub read_only: bool,
    /// The volume must not exist yet (`import`): an existing manifest is refused.
    pub create: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn err(kind: BlockErrorKind, msg: impl Into<String>) -> BlockError {
    BlockError::new(kind, msg)
}

/// An object's cached bytes: as downloaded (the HTTP client's own buffers, not copied: a
/// read copies once, from them into the caller's buffer) until the first write makes them
/// one owned vector (copy-on-write against uploads in flight).
#[derive(Clone)]
enum ObjData {
    Fetched(Buffer),
    Owned(Arc<Vec<u8>>),
}

impl ObjData {
    fn len(&self) -> usize {
        match self {
            ObjData::Fetched(b) => b.len(),
            ObjData::Owned(v) => v.len(),
        }
    }

    /// Copies `[at, at + out.len())` into `out`.
    fn copy_out(&self, at: usize, out: &mut [u8]) {
        match self {
            ObjData::Fetched(b) => {
                let mut part = b.slice(at..at + out.len());
                bytes::Buf::copy_to_slice(&mut part, out);
            }
            ObjData::Owned(v) => out.copy_from_slice(&v[at..at + out.len()]),
        }
    }

    fn is_zero(&self, at: usize, len: usize) -> bool {
        match self {
            ObjData::Fetched(b) => Iterator::all(&mut b.slice(at..at + len), |c| is_zero(&c)),
            ObjData::Owned(v) => is_zero(&v[at..at + len]),
        }
    }

    /// The bytes to write into (copied out of the download's buffers the first time).
    fn make_mut(&mut self) -> &mut Vec<u8> {
        if let ObjData::Fetched(b) = self {
            *self = ObjData::Owned(Arc::new(b.to_vec()));
        }
        match self {
            ObjData::Owned(v) => Arc::make_mut(v),
            ObjData::Fetched(_) => unreachable!("made owned just above"),
        }
    }
}

/// One object's cache state.
#[derive(Default)]
struct SlotState {
    /// The object's bytes when cached.
    data: Option<ObjData>,
    /// Written since the last upload.
    dirty: bool,
    /// Bumped by every write: an upload marks the slot clean only if nothing was written
    /// while it was in flight.
    generation: u64,
    /// The sectors written since the object's last upload began, one bit each (allocated by
    /// the first write), and how many.
    covered: Vec<u64>,
    covered_sectors: usize,
    /// All of them: a writer filled the object (write-behind uploads it).
    filled: bool,
}

impl SlotState {
    /// Records a write of `[at, at + len)` of an `olen`-byte object; true once writes since
    /// the last upload began have covered all of it.
    fn cover(&mut self, at: usize, len: usize, olen: usize) -> bool {
        const S: usize = BLOCK as usize;
        let sectors = olen.div_ceil(S);
        if self.covered.len() != sectors.div_ceil(64) {
            self.covered = vec![0; sectors.div_ceil(64)];
            self.covered_sectors = 0;
        }
        let (first, end) = (at.div_ceil(S), ((at + len) / S).min(sectors));
        let mut k = first;
        while k < end {
            let n = (64 - k % 64).min(end - k);
            let mask = (u64::MAX >> (64 - n)) << (k % 64);
            let w = &mut self.covered[k / 64];
            self.covered_sectors += (mask & !*w).count_ones() as usize;
            *w |= mask;
            k += n;
        }
        self.filled |= self.covered_sectors == sectors;
        self.filled
    }

    /// Forgets what was written (an upload of it began).
    fn uncover(&mut self) {
        self.covered.fill(0);
        self.covered_sectors = 0;
        self.filled = false;
    }
}

#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    last_use: AtomicU64,
}

/// A background download (read-ahead), streamed: its bytes are kept as they arrive, in order,
/// so a reader copies out the part it needs before the rest of the object is in (the copy
/// overlaps the download), and [`fetch`](Inner::fetch) takes the whole object over at the end.
#[derive(Default)]
struct Prefetch {
    st: Mutex<Streamed>,
    cv: Condvar,
}

#[derive(Default)]
struct Streamed {
    /// The bytes arrived so far, as the HTTP client delivered them (not copied).
    chunks: Vec<bytes::Bytes>,
    /// Where each chunk starts in the object.
    starts: Vec<usize>,
    got: usize,
    /// The reader waits until this many bytes arrived (0: nobody waits for a part).
    want: usize,
    /// The download ended (all bytes in, or failed).
    done: Option<Result<(), opendal::Error>>,
}

impl Prefetch {
    /// Downloads `key` into `self` chunk by chunk (from the start again on a retry).
    async fn stream(&self, op: &Operator, key: &str) -> Result<(), opendal::Error> {
        {
            let mut st = lock(&self.st);
            st.chunks.clear();
            st.starts.clear();
            st.got = 0;
        }
        let mut s = op.reader(key).await?.into_stream(..).await?;
        while let Some(b) = futures::TryStreamExt::try_next(&mut s).await? {
            let mut st = lock(&self.st);
            for c in b {
                let at = st.got;
                st.starts.push(at);
                st.got += c.len();
                st.chunks.push(c);
            }
            if st.want != 0 && st.got >= st.want {
                st.want = 0;
                drop(st);
                self.cv.notify_all();
            }
        }
        Ok(())
    }

    /// Copies `[at, at + out.len())` into `out` once those bytes arrived; false when the
    /// download ended first (the caller takes the whole object, or its error, from `fetch`).
    fn copy_part(&self, at: usize, out: &mut [u8]) -> bool {
        if out.is_empty() {
            return true;
        }
        let end = at + out.len();
        let mut st = lock(&self.st);
        loop {
            if st.done.is_some() {
                return false;
            }
            if st.got >= end {
                break;
            }
            st.want = if st.want == 0 { end } else { st.want.min(end) };
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        // Take references to the chunks (no copy), then copy without holding the lock.
        let first = st.starts.partition_point(|&s| s <= at) - 1;
        let parts: Vec<(usize, bytes::Bytes)> = st.starts[first..]
            .iter()
            .zip(&st.chunks[first..])
            .take_while(|(s, _)| **s < end)
            .map(|(s, c)| (*s, c.clone()))
            .collect();
        drop(st);
        for (s, c) in parts {
            let from = at.max(s);
            let to = end.min(s + c.len());
            out[from - at..to - at].copy_from_slice(&c[from - s..to - s]);
        }
        true
    }

    /// Waits for the download to end; the whole object, or its error.
    fn take(&self) -> Result<Buffer, opendal::Error> {
        let mut st = lock(&self.st);
        loop {
            if let Some(r) = st.done.take() {
                return r.map(|()| Buffer::from(std::mem::take(&mut st.chunks)));
            }
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Read-ahead downloads waiting to start, in order (key, download, bytes), how many run and
/// how many bytes they fetch, and their tasks.
#[derive(Default)]
struct AheadQueue {
    waiting: std::collections::VecDeque<(String, Arc<Prefetch>, u64)>,
    running: usize,
    running_bytes: u64,
    /// The most bytes ever in flight at once (what the tests check the cap against).
    peak_bytes: u64,
    /// The tasks started (finished ones are pruned at the next start), aborted when the
    /// device is dropped: the runtime outlives devices.
    tasks: Vec<tokio::task::AbortHandle>,
}

/// The read-ahead pipeline: at most `limit` downloads and at most `budget` bytes of them at
/// once (but always one), started in queue order, each finished download starting the next at
/// once (the pipe stays full without waiting for the reader). Holds no reference to the
/// device, so its tasks never keep it alive.
struct Ahead {
    op: Operator,
    timeout: Duration,
    limit: usize,
    budget: u64,
    queue: Mutex<AheadQueue>,
}

impl Ahead {
    /// Starts queued downloads while fewer than `limit` run and the next one fits in `budget`
    /// beside those running (or none runs).
    fn pump(self: &Arc<Self>, rt: &tokio::runtime::Handle) {
        let mut q = lock(&self.queue);
        while q.running < self.limit {
            let Some(&(_, _, len)) = q.waiting.front() else { break };
            if q.running > 0 && q.running_bytes + len > self.budget {
                break;
            }
            let Some((key, p, len)) = q.waiting.pop_front() else { break };
            // Nobody holds it but the queue: dropped from the device's map (the reader went
            // past it, or the object was overwritten whole) before its turn came.
            if Arc::strong_count(&p) == 1 {
                continue;
            }
            q.running += 1;
            q.running_bytes += len;
            q.peak_bytes = q.peak_bytes.max(q.running_bytes);
            let me = Arc::clone(self);
            let task = rt.spawn(async move {
                let r = retry(me.timeout, "reading ahead", || p.stream(&me.op, &key)).await;
                lock(&p.st).done = Some(r);
                p.cv.notify_all();
                {
                    let mut q = lock(&me.queue);
                    q.running -= 1;
                    q.running_bytes -= len;
                }
                me.pump(&tokio::runtime::Handle::current());
            });
            q.tasks.retain(|t| !t.is_finished());
            q.tasks.push(task.abort_handle());
        }
    }

    /// Drops the queued downloads and aborts the running ones (the device is closing).
    fn stop(&self) {
        let mut q = lock(&self.queue);
        q.waiting.clear();
        for t in q.tasks.drain(..) {
            t.abort();
        }
    }
}

/// The lease this device holds.
struct Lease {
    token: String,
}

/// What uploads share between the device and its background uploads' tasks (no reference to
/// the device, so a task never keeps it alive): the store, which objects it holds, the lease,
/// the write-back latch and the uploads under way.
struct Store {
    op: Operator,
    timeout: Duration,
    /// The volume's name and the endpoint, for messages.
    name: String,
    endpoint: String,
    lease_key: String,
    /// Requests in flight at once (`concurrency=`): write-behind uploads, a flush's or an
    /// eviction's uploads, and read-ahead downloads each.
    limit: usize,
    /// Objects that exist in the store (from the listing at open, kept by uploads).
    present: Mutex<HashSet<u64>>,
    lease: Mutex<Option<Lease>>,
    /// The lease was found taken over: nothing is written to the store any more.
    lost: AtomicBool,
    latch: WritebackLatch,
    uploads: Mutex<Uploads>,
    /// Signalled whenever an upload ends and its objects' claims are released.
    ended: Condvar,
}

/// One lease check shared by the write-behind uploads that wait for it: the first of them to
/// run does the GET, the others wait for its outcome (an error message when it failed).
type LeaseCheck = tokio::sync::OnceCell<Result<(), String>>;

/// Uploads under way. An object is claimed by one upload at a time (queued or running
/// write-behind, or a flush's or eviction's batch), so two uploads of one object never race
/// and land out of order.
#[derive(Default)]
struct Uploads {
    claimed: HashSet<u64>,
    /// Filled objects waiting for their write-behind upload (index, slot, key), in the order
    /// they were filled.
    queue: VecDeque<(u64, Arc<Slot>, String)>,
    /// Write-behind uploads running.
    running: usize,
    /// The lease check the write-behind uploads starting now wait for, and how many started
    /// since it was made: a new one is made for the first upload after a pause and for
    /// every `limit`-th.
    check: Option<Arc<LeaseCheck>>,
    unchecked: usize,
    /// The tasks started (finished ones pruned at the next start), aborted at close.
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Store {
    fn lost_lease(&self) -> BlockError {
        err(
            BlockErrorKind::Io,
            format!(
                "{}: lost the lease: another writer took the volume over; nothing more is written",
                self.name
            ),
        )
    }

    /// Fails unless the lease in the store is still this device's. Uploads are preceded by
    /// this check (a flush's and an eviction's batch; write-behind's per window of `limit`
    /// uploads, [`LeaseCheck`]), so a writer whose lease was broken stops writing within one
    /// window of uploads; once lost, the lease stays lost (latched), and it is not deleted at
    /// close (it is the new writer's).
    async fn check_lease(&self) -> BlockResult<()> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(self.lost_lease());
        }
        let Some(token) = lock(&self.lease).as_ref().map(|l| l.token.clone()) else { return Ok(()) };
        let bytes = retry(self.timeout, "checking the lease", || self.op.read(&self.lease_key))
            .await
            .map_err(|e| err(BlockErrorKind::Io, format!("{}: checking the lease failed: {e}", self.name)))?;
        let holder = serde_json::from_slice::<serde_json::Value>(&bytes.to_vec())
            .ok()
            .and_then(|v| v.get("holder").and_then(|h| h.as_str()).map(str::to_owned));
        if holder.as_deref() != Some(token.as_str()) {
            *lock(&self.lease) = None;
            self.lost.store(true, Ordering::SeqCst);
            let e = self.lost_lease();
            self.latch.record(&e);
            return Err(e);
        }
        Ok(())
    }

    /// The slot's bytes and generation to upload, when it is dirty; its coverage starts over.
    fn snapshot(slot: &Slot) -> Option<(Arc<Vec<u8>>, u64)> {
        let mut st = lock(&slot.state);
        let d = match &st.data {
            Some(ObjData::Owned(d)) if st.dirty => Arc::clone(d),
            _ => return None,
        };
        st.uncover();
        Some((d, st.generation))
    }

    /// Uploads `data` as object `idx` (deletes the object instead when it is all zeroes) and
    /// marks the slot clean unless it was written since the snapshot of `generation`.
    async fn put(
        &self,
        idx: u64,
        key: &str,
        slot: &Slot,
        data: Arc<Vec<u8>>,
        generation: u64,
    ) -> BlockResult<()> {
        let zero = is_zero(&data);
        let body = (!zero).then(|| Buffer::from(bytes::Bytes::from_owner(Shared(data))));
        retry(self.timeout, "uploading", || {
            let (op, key, body) = (self.op.clone(), key.to_owned(), body.clone());
            async move {
                match body {
                    // A content type: some GCS servers (the emulator) answer an upload
                    // without one with JSON OpenDAL cannot parse.
                    Some(b) => {
                        op.write_with(&key, b).content_type("application/octet-stream").await.map(|_| ())
                    }
                    None => op.delete(&key).await,
                }
            }
        })
        .await
        .map_err(|e| {
            err(
                dal_kind(&e),
                format!("{}: uploading object {idx} to {} failed: {e}", self.name, self.endpoint),
            )
        })?;
        {
            let mut p = lock(&self.present);
            if zero {
                p.remove(&idx);
            } else {
                p.insert(idx);
            }
        }
        let mut st = lock(&slot.state);
        if st.generation == generation {
            st.dirty = false;
        }
        Ok(())
    }

    /// Queues the write-behind upload of object `idx`, which a writer just filled, unless an
    /// upload already has it.
    fn write_behind(self: &Arc<Self>, rt: &tokio::runtime::Handle, idx: u64, slot: Arc<Slot>, key: String) {
        if self.lost.load(Ordering::SeqCst) || self.latch.is_latched() {
            return;
        }
        let mut u = lock(&self.uploads);
        if !u.claimed.insert(idx) {
            return;
        }
        u.queue.push_back((idx, slot, key));
        drop(u);
        self.pump(rt);
    }

    /// Starts queued write-behind uploads while fewer than `limit` run; each one ending
    /// starts the next (the pipe stays full without waiting for the writer).
    fn pump(self: &Arc<Self>, rt: &tokio::runtime::Handle) {
        let mut u = lock(&self.uploads);
        while u.running < self.limit {
            let Some((idx, slot, key)) = u.queue.pop_front() else { break };
            let check = match &u.check {
                Some(c) if u.running > 0 && u.unchecked < self.limit => Arc::clone(c),
                _ => {
                    u.unchecked = 0;
                    Arc::clone(u.check.insert(Arc::new(LeaseCheck::new())))
                }
            };
            u.unchecked += 1;
            u.running += 1;
            let me = Arc::clone(self);
            let task = rt.spawn(async move {
                let r = me.upload_behind(idx, &slot, &key, &check).await;
                // (A lost lease is reported by every flush from then on, not once per object.)
                match &r {
                    Err(e) if !me.lost.load(Ordering::SeqCst) => {
                        log::warn!(
                            "{}: write-behind: {e}; the object stays dirty for the next flush",
                            me.name
                        )
                    }
                    _ => {}
                }
                // Filled again while it uploaded: once more.
                let again = r.is_ok() && {
                    let st = lock(&slot.state);
                    st.dirty && st.filled
                };
                {
                    let mut u = lock(&me.uploads);
                    u.running -= 1;
                    u.claimed.remove(&idx);
                }
                me.ended.notify_all();
                let rt = tokio::runtime::Handle::current();
                if again {
                    me.write_behind(&rt, idx, slot, key);
                }
                me.pump(&rt);
            });
            u.tasks.retain(|t| !t.is_finished());
            u.tasks.push(task.abort_handle());
        }
    }

    /// A write-behind upload: once its lease check passed (made by this upload or by
    /// another of its window), unless the lease was found lost meanwhile.
    async fn upload_behind(&self, idx: u64, slot: &Slot, key: &str, check: &LeaseCheck) -> BlockResult<()> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(self.lost_lease());
        }
        let Some((data, generation)) = Self::snapshot(slot) else { return Ok(()) };
        let checked =
            check.get_or_init(|| async { self.check_lease().await.map_err(|e| e.to_string()) }).await;
        if self.lost.load(Ordering::SeqCst) {
            return Err(self.lost_lease());
        }
        if let Err(why) = checked {
            return Err(err(BlockErrorKind::Io, why.clone()));
        }
        self.put(idx, key, slot, data, generation).await
    }

    /// Claims `idxs` for a flush's or an eviction's upload: their queued write-behind is
    /// taken over, running uploads of them are waited for.
    fn claim(&self, idxs: &[u64]) {
        let mut u = lock(&self.uploads);
        let mut mine = vec![false; idxs.len()];
        loop {
            for (m, idx) in mine.iter_mut().zip(idxs) {
                if *m {
                    continue;
                }
                if let Some(p) = u.queue.iter().position(|q| q.0 == *idx) {
                    u.queue.remove(p);
                    *m = true;
                } else {
                    *m = u.claimed.insert(*idx);
                }
            }
            if mine.iter().all(|m| *m) {
                return;
            }
            u = self.ended.wait(u).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn release(&self, idxs: &[u64]) {
        let mut u = lock(&self.uploads);
        for i in idxs {
            u.claimed.remove(i);
        }
        drop(u);
        self.ended.notify_all();
    }

    /// Waits for a write-behind upload to end; false at once when none runs.
    fn wait_for_one(&self) -> bool {
        let u = lock(&self.uploads);
        if u.running == 0 {
            return false;
        }
        drop(self.ended.wait(u).unwrap_or_else(|e| e.into_inner()));
        true
    }

    /// Drops the queued write-behind and aborts the running uploads (the device is closing).
    fn stop(&self) {
        let mut u = lock(&self.uploads);
        u.queue.clear();
        for t in u.tasks.drain(..) {
            t.abort();
        }
    }
}

struct Inner {
    loc: Locator,
    rt: &'static tokio::runtime::Runtime,
    size: u64,
    object_size: u64,
    cache_limit: u64,
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
    cached: AtomicU64,
    clock: AtomicU64,
    /// Serializes write-back (flush and cache eviction).
    writeback: Mutex<()>,
    /// The store, the lease and the uploads, shared with the upload tasks.
    st: Arc<Store>,
    /// Upload an object as soon as a writer has filled it (`write_behind=`).
    write_behind: bool,
    /// Read-ahead in flight or done, by object.
    inflight: Mutex<HashMap<u64, Arc<Prefetch>>>,
    /// The object of the last cache miss (sequential readers are read ahead of).
    last_miss: AtomicU64,
    /// Read-ahead downloads, queued in the order the reader will want them.
    ahead: Arc<Ahead>,
}

/// A volume on object storage. Cheap to clone; opening the same volume twice in one process
/// shares one cache (and one lease).
#[derive(Clone)]
pub struct ObjectDevice {
    inner: Arc<Inner>,
    read_only: bool,
}

impl std::fmt::Debug for ObjectDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectDevice")
            .field("locator", &self.inner.loc.display())
            .field("size", &self.inner.size)
            .field("object_size", &self.inner.object_size)
            .field("read_only", &self.read_only)
            .finish()
    }
}

/// Volumes open in this process, so that two opens of one volume share its cache and lease.
static OPEN: Mutex<Vec<(String, Weak<Inner>)>> = Mutex::new(Vec::new());

/// Opens (or, with `size=` on an empty prefix, creates) the volume `locator` names.
/// Nothing is written before the store's contents are checked.
pub fn open(locator: &str, o: OpenOptions) -> BlockResult<ObjectDevice> {
    let loc = Locator::parse(locator).map_err(|e| err(BlockErrorKind::InvalidArgument, e.to_string()))?;
    let id = loc.identity();
    let existing = {
        let mut open = lock(&OPEN);
        open.retain(|(_, w)| w.strong_count() > 0);
        open.iter().find(|(k, _)| *k == id).and_then(|(_, w)| w.upgrade())
    };
    if o.create && existing.is_some() {
        return Err(err(BlockErrorKind::Busy, format!("{} is open in this process already", loc.display())));
    }
    let inner = match existing {
        Some(i) => i,
        None => {
            let i = Arc::new(Inner::open(loc, o.create)?);
            lock(&OPEN).push((id, Arc::downgrade(&i)));
            i
        }
    };
    if !o.read_only {
        inner.acquire_lease()?;
    }

    Ok(ObjectDevice { inner, read_only: o.read_only })
}

/// The two-thread tokio runtime every object-backed device of this process runs its requests
/// on, started by the first open and kept for the process's life. One per process rather than
/// per device: its threads' memory stays theirs, so the buffers a download receives into
/// reuse what earlier downloads freed instead of faulting in fresh pages (a runtime per open
/// took a page fault for nearly every 4 KiB read; BENCHMARKS.md, object storage, seventh
/// pass), and several open volumes share two threads.
fn runtime() -> BlockResult<&'static tokio::runtime::Runtime> {
    static RT: Mutex<Option<&'static tokio::runtime::Runtime>> = Mutex::new(None);
    let mut rt = lock(&RT);
    if let Some(r) = *rt {
        return Ok(r);
    }
    let r = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sealdisk-objstore")
        .enable_all()
        .build()
        .map_err(|e| BlockError::io("starting the object-storage runtime", e))?;
    let r: &'static tokio::runtime::Runtime = Box::leak(Box::new(r));
    *rt = Some(r);
    Ok(r)
}

fn dal_kind(e: &opendal::Error) -> BlockErrorKind {
    match e.kind() {
        DalKind::PermissionDenied => BlockErrorKind::Io,
        DalKind::ConditionNotMatch => BlockErrorKind::Busy,
        DalKind::ConfigInvalid => BlockErrorKind::InvalidArgument,
        _ => BlockErrorKind::Io,
    }
}

impl Inner {
    /// Runs `f` (built afresh per attempt) on the runtime with the request timeout, retrying
    /// temporary failures twice.
    fn run<T, F, Fut>(&self, what: &str, f: F) -> Result<T, opendal::Error>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, opendal::Error>>,
    {
        run_on(self.rt, self.st.timeout, what, f)
    }

    fn open(loc: Locator, create: bool) -> BlockResult<Inner> {
        let rt = runtime()?;
        let op = operator(&loc)?;
        let timeout = Duration::from_secs(loc.timeout.unwrap_or(60));
        let shown = loc.display();
        let here = describe_endpoint(&loc);
        let net = |what: &str, e: opendal::Error| -> BlockError {
            if is_bucket_missing(&e) {
                return err(
                    BlockErrorKind::Io,
                    format!("{shown}: bucket {:?} not found at {here}", loc.bucket),
                );
            }
            match e.kind() {
                DalKind::PermissionDenied => err(
                    BlockErrorKind::Io,
                    format!(
                        "{shown}: access denied by {here} while {what}: check the credentials \
                         ({}) and the bucket's policy",
                        credential_sources(loc.service)
                    ),
                )
                .with_source(e),
                DalKind::NotFound => {
                    err(BlockErrorKind::Io, format!("{shown}: bucket {:?} not found at {here}", loc.bucket))
                        .with_source(e)
                }
                _ => err(dal_kind(&e), format!("{shown}: {what} at {here} failed: {e}")),
            }
        };
        let manifest_key = loc.key(MANIFEST);
        let data_dir = loc.key(DATA);
        // The manifest and the listing of the data objects at once (one round trip instead
        // of two before the first read); the listing is checked once the manifest is.
        let (manifest, listed) = rt.block_on(futures::future::join(
            retry(timeout, "reading the manifest", || op.read(&manifest_key)),
            retry(timeout, "listing the data objects", || {
                op.list_with(&data_dir).recursive(true).into_future()
            }),
        ));
        let manifest = match manifest {
            Ok(b) => Some(b.to_vec()),
            Err(e) if e.kind() == DalKind::NotFound && !is_bucket_missing(&e) => None,
            Err(e) => return Err(net("reading the manifest", e)),
        };
        let (size, object_size) = match manifest {
            Some(_) if create => {
                return Err(err(
                    BlockErrorKind::InvalidArgument,
                    format!("{shown} already holds a volume; refusing to overwrite it"),
                ))
            }
            Some(bytes) => {
                let (size, osz) = parse_manifest(&bytes).map_err(|why| {
                    err(
                        BlockErrorKind::InvalidArgument,
                        format!("{shown}: {MANIFEST} is not a sealdisk volume manifest: {why}"),
                    )
                })?;
                if let Some(want) = loc.size.filter(|w| *w != size) {
                    return Err(err(
                        BlockErrorKind::InvalidArgument,
                        format!("{shown}: the volume is {size} bytes, not size={want}"),
                    ));
                }
                if let Some(want) = loc.object_size.filter(|w| *w != osz) {
                    return Err(err(
                        BlockErrorKind::InvalidArgument,
                        format!("{shown}: the volume's objects are {osz} bytes, not object_size={want}"),
                    ));
                }
                (size, osz)
            }
            None => {
                // No manifest: only an empty prefix may become a volume.
                let dir = if loc.prefix.is_empty() { "/".to_owned() } else { format!("{}/", loc.prefix) };
                let first = run_on(rt, timeout, "listing the prefix", || async {
                    let mut l = op.lister_with(&dir).recursive(true).await?;
                    while let Some(e) = l.next().await {
                        let e = e?;
                        if e.metadata().is_file() {
                            return Ok(Some(e.path().to_owned()));
                        }
                    }
                    Ok(None)
                })
                .map_err(|e| net("listing the prefix", e))?;
                if let Some(p) = first {
                    return Err(err(
                        BlockErrorKind::InvalidArgument,
                        format!(
                            "{shown}: the prefix holds objects ({p}, …) but no {MANIFEST}: it is not a \
                             sealdisk volume; refusing to use it"
                        ),
                    ));
                }
                let Some(size) = loc.size else {
                    return Err(err(
                        BlockErrorKind::InvalidArgument,
                        format!(
                            "{shown}: no volume here (no {MANIFEST}); create one with ?size=BYTES on \
                             the locator or with `sealdisk import FILE {shown}`"
                        ),
                    ));
                };
                let osz = loc.object_size.unwrap_or(crate::DEFAULT_OBJECT_SIZE);
                let body = manifest_json(size, osz);
                run_on(rt, timeout, "creating the manifest", || {
                    op.write_with(&manifest_key, body.clone()).if_not_exists(true).into_future()
                })
                .map_err(|e| {
                    if e.kind() == DalKind::ConditionNotMatch {
                        err(BlockErrorKind::Busy, format!("{shown}: another opener created the volume first"))
                    } else {
                        net("creating the manifest", e)
                    }
                })?;
                log::info!("{shown}: created a volume of {size} bytes in objects of {osz} bytes");
                (size, osz)
            }
        };
        // Every data object must be one of ours, of the right size.
        let entries = listed.map_err(|e| net("listing the data objects", e))?;
        let count = size.div_ceil(osz_nonzero(object_size));
        let mut present = HashSet::new();
        for e in entries.iter().filter(|e| e.metadata().is_file()) {
            let name = e.path().strip_prefix(&data_dir).unwrap_or(e.path());
            let idx = (name.len() == 16).then(|| u64::from_str_radix(name, 16).ok()).flatten();
            let Some(idx) = idx.filter(|i| *i < count) else {
                return Err(err(
                    BlockErrorKind::InvalidArgument,
                    format!("{shown}: {} is not a data object of this volume ({count} objects)", e.path()),
                ));
            };
            let want = object_len(size, object_size, idx);
            let got = e.metadata().content_length();
            if got != want {
                return Err(err(
                    BlockErrorKind::InvalidArgument,
                    format!(
                        "{shown}: object {} is {got} bytes, expected {want}: not part of this volume",
                        e.path()
                    ),
                ));
            }
            present.insert(idx);
        }
        let concurrency = loc.concurrency.unwrap_or(crate::DEFAULT_CONCURRENCY);
        let readahead = loc.readahead.unwrap_or(crate::DEFAULT_READAHEAD);
        let st = Arc::new(Store {
            op: op.clone(),
            timeout,
            name: shown.clone(),
            endpoint: here.clone(),
            lease_key: loc.key(LEASE),
            limit: concurrency,
            present: Mutex::new(present),
            lease: Mutex::new(None),
            lost: AtomicBool::new(false),
            latch: WritebackLatch::new(),
            uploads: Mutex::new(Uploads::default()),
            ended: Condvar::new(),
        });
        Ok(Inner {
            cache_limit: loc.cache.unwrap_or(crate::DEFAULT_CACHE).max(2 * object_size),
            write_behind: loc.write_behind,
            loc,
            rt,
            size,
            object_size,
            slots: Mutex::new(HashMap::new()),
            cached: AtomicU64::new(0),
            clock: AtomicU64::new(0),
            writeback: Mutex::new(()),
            st,
            inflight: Mutex::new(HashMap::new()),
            last_miss: AtomicU64::new(u64::MAX),
            ahead: Arc::new(Ahead {
                op: op.clone(),
                timeout,
                limit: concurrency,
                budget: readahead,
                queue: Mutex::new(AheadQueue::default()),
            }),
        })
    }

    fn acquire_lease(&self) -> BlockResult<()> {
        let mut lease = lock(&self.st.lease);
        if lease.is_some() {
            return Ok(());
        }
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|e| err(BlockErrorKind::Io, format!("random lease token: {e}")))?;
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let body = serde_json::json!({
            "holder": token,
            "host": host.trim(),
            "pid": std::process::id(),
            "since": since,
        })
        .to_string();
        let key = &self.st.lease_key;
        let shown = &self.st.name;
        let conditional = !self.loc.break_lease;
        let r = self.run("taking the lease", || {
            self.st.op.write_with(key, body.clone()).if_not_exists(conditional).into_future()
        });
        match r {
            Ok(_) => {
                if !conditional {
                    log::warn!("{shown}: broke the previous writer's lease (break_lease=1)");
                }
                *lease = Some(Lease { token });
                Ok(())
            }
            Err(e) if e.kind() == DalKind::ConditionNotMatch => {
                let holder = self
                    .run("reading the lease", || self.st.op.read(key))
                    .map(|b| String::from_utf8_lossy(&b.to_vec()).into_owned())
                    .unwrap_or_else(|_| "unknown".into());
                Err(err(
                    BlockErrorKind::Busy,
                    format!(
                        "{shown} is in use by another writer (lease {holder}); if that writer is gone, \
                         open with ?break_lease=1"
                    ),
                ))
            }
            Err(e) => Err(err(
                BlockErrorKind::Io,
                format!("{shown}: taking the lease at {} failed: {e}", self.st.endpoint),
            )),
        }
    }

    /// [`Store::check_lease`], from a caller outside the runtime.
    fn check_lease(&self) -> BlockResult<()> {
        self.rt.block_on(self.st.check_lease())
    }

    fn data_key(&self, idx: u64) -> String {
        self.loc.key(&format!("{DATA}{idx:016x}"))
    }

    fn slot(&self, idx: u64) -> Arc<Slot> {
        let s = Arc::clone(lock(&self.slots).entry(idx).or_default());
        s.last_use.store(self.clock.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        s
    }

    /// Downloads object `idx` (zeroes when absent), or takes its read-ahead.
    fn fetch(&self, idx: u64) -> BlockResult<Buffer> {
        let want = object_len(self.size, self.object_size, idx) as usize;
        let key = self.data_key(idx);
        let ahead = lock(&self.inflight).remove(&idx);
        let r = match ahead {
            Some(p) => p.take(),
            None if !lock(&self.st.present).contains(&idx) => return Ok(Buffer::from(vec![0; want])),
            None => self.run("downloading", || self.st.op.read(&key)),
        };
        match r {
            Ok(b) if b.len() == want => Ok(b),
            Ok(b) => Err(err(
                BlockErrorKind::Io,
                format!("{}: object {key} is {} bytes, expected {want}", self.loc.display(), b.len()),
            )),
            Err(e) if e.kind() == DalKind::NotFound => Ok(Buffer::from(vec![0; want])),
            Err(e) => {
                Err(err(dal_kind(&e), format!("{}: downloading {key} failed: {e}", self.loc.display())))
            }
        }
    }

    /// How many objects a sequential reader is read ahead of: twice as many as may download
    /// at once (`concurrency`, fewer when `readahead=` bytes of objects are fewer; so a
    /// download that finishes starts the next one at once, without waiting for the reader to
    /// reach it), fewer when that would hold more than the cache's size (never fewer than
    /// may download at once).
    fn ahead_window(&self) -> u64 {
        ahead_sizes(self.st.limit, self.ahead.budget, self.object_size, self.cache_limit).1
    }

    /// After a miss on `idx` right behind the previous miss (a sequential reader), queues
    /// downloads of `idx` itself (so the reader gets its bytes as they stream in) and of the
    /// next [`ahead_window`](Self::ahead_window) objects in the background (at most
    /// `concurrency` and `readahead=` bytes of them at a time, but always one);
    /// [`fetch`](Self::fetch) takes them over.
    fn read_ahead(&self, idx: u64) {
        let prev = self.last_miss.swap(idx, Ordering::Relaxed);
        if prev.wrapping_add(1) != idx {
            return;
        }
        let count = self.size.div_ceil(self.object_size);
        let mut inflight = lock(&self.inflight);
        // Read-ahead the reader went past is never taken: drop it (a queued one that has
        // not started yet then skips its download).
        inflight.retain(|j, _| *j >= idx);
        let mut queued = Vec::new();
        for j in idx..(idx + 1 + self.ahead_window()).min(count) {
            if inflight.contains_key(&j) || !lock(&self.st.present).contains(&j) {
                continue;
            }
            let cached = lock(&self.slots)
                .get(&j)
                .is_some_and(|s| s.state.try_lock().map_or(true, |st| st.data.is_some()));
            if cached {
                continue;
            }
            let p = Arc::new(Prefetch::default());
            inflight.insert(j, Arc::clone(&p));
            queued.push((self.data_key(j), p, object_len(self.size, self.object_size, j)));
        }
        drop(inflight);
        if !queued.is_empty() {
            lock(&self.ahead.queue).waiting.extend(queued);
            self.ahead.pump(self.rt.handle());
        }
    }

    /// Makes room for `need` more cached bytes: drops clean objects (least recently used
    /// first), uploading dirty ones when nothing clean is left.
    fn make_room(&self, need: u64) -> BlockResult<()> {
        if self.cached.load(Ordering::Relaxed) + need <= self.cache_limit {
            return Ok(());
        }
        let _wb = lock(&self.writeback);
        loop {
            if self.cached.load(Ordering::Relaxed) + need <= self.cache_limit {
                return Ok(());
            }
            let mut loaded: Vec<(u64, u64, Arc<Slot>)> = lock(&self.slots)
                .iter()
                .map(|(i, s)| (s.last_use.load(Ordering::Relaxed), *i, Arc::clone(s)))
                .collect();
            loaded.sort_unstable_by_key(|(t, _, _)| *t);
            let mut freed = false;
            let mut dirty = Vec::new();
            for (_, idx, s) in &loaded {
                let Ok(mut st) = s.state.try_lock() else { continue };
                let Some(d) = st.data.as_ref() else { continue };
                if st.dirty {
                    if dirty.len() < self.st.limit {
                        dirty.push((*idx, Arc::clone(s)));
                    }
                    continue;
                }
                self.cached.fetch_sub(d.len() as u64, Ordering::Relaxed);
                st.data = None;
                freed = true;
                if self.cached.load(Ordering::Relaxed) + need <= self.cache_limit {
                    return Ok(());
                }
            }
            if freed {
                continue;
            }
            // Write-behind uploads under way end with their objects clean: wait for one
            // rather than start more.
            if self.st.wait_for_one() {
                continue;
            }
            if dirty.is_empty() {
                // Everything is busy: let the caller go over the limit for now.
                return Ok(());
            }
            // Fencing: a writer whose lease was broken must not overwrite the new writer's
            // objects, so write-back forced by a full cache checks the lease first, as flush does.
            self.check_lease()?;
            self.upload(dirty)?;
        }
    }

    /// Uploads the given slots' current contents concurrently (once write-behind is done
    /// with them); each is marked clean if it was not written meanwhile. The first failure
    /// is returned.
    fn upload(&self, slots: Vec<(u64, Arc<Slot>)>) -> BlockResult<()> {
        let idxs: Vec<u64> = slots.iter().map(|(i, _)| *i).collect();
        self.st.claim(&idxs);
        let results: Vec<BlockResult<()>> = self.rt.block_on(
            futures::stream::iter(slots)
                .filter_map(|(i, s)| async move { Store::snapshot(&s).map(|(d, g)| (i, s, d, g)) })
                .map(|(i, s, d, g)| async move { self.st.put(i, &self.data_key(i), &s, d, g).await })
                .buffer_unordered(self.st.limit)
                .collect(),
        );
        self.st.release(&idxs);
        results.into_iter().collect()
    }

    fn flush(&self) -> BlockResult<()> {
        self.st.latch.check("flush")?;
        let _wb = lock(&self.writeback);
        let dirty: Vec<(u64, Arc<Slot>)> = lock(&self.slots)
            .iter()
            .filter(|(_, s)| lock(&s.state).dirty)
            .map(|(i, s)| (*i, Arc::clone(s)))
            .collect();
        // The lease before uploading (fencing) and after (a takeover during the uploads).
        let before = if dirty.is_empty() { Ok(()) } else { self.check_lease() };
        let r = before.and_then(|()| self.upload(dirty)).and_then(|()| self.check_lease());
        self.st.latch.guard(r)
    }

    /// Calls `f(idx, offset in object, range in buf)` for each object `[off, off+len)` touches.
    fn split(
        &self,
        off: u64,
        len: u64,
        mut f: impl FnMut(u64, usize, std::ops::Range<usize>) -> BlockResult<()>,
    ) -> BlockResult<()> {
        let mut pos = off;
        while pos < off + len {
            let idx = pos / self.object_size;
            let in_obj = pos % self.object_size;
            let n = (self.object_size - in_obj).min(off + len - pos);
            let b = (pos - off) as usize;
            f(idx, in_obj as usize, b..b + n as usize)?;
            pos += n;
        }
        Ok(())
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.split(off, buf.len() as u64, |idx, at, r| {
            let s = self.slot(idx);
            let mut st = lock(&s.state);
            if st.data.is_none() {
                if !lock(&self.st.present).contains(&idx) {
                    buf[r].fill(0);
                    return Ok(());
                }
                drop(st);
                self.read_ahead(idx);
                self.make_room(self.object_size)?;
                st = lock(&s.state);
                if st.data.is_none() {
                    // Its download is under way: copy this read's bytes out as soon as they
                    // arrived, overlapping the copy with the rest of the download. The read
                    // of the object's last bytes waits for all of it (and checks its length)
                    // and caches it.
                    let olen = object_len(self.size, self.object_size, idx) as usize;
                    if at + r.len() < olen {
                        let p = lock(&self.inflight).get(&idx).cloned();
                        if p.is_some_and(|p| p.copy_part(at, &mut buf[r.clone()])) {
                            return Ok(());
                        }
                    }
                    let d = self.fetch(idx)?;
                    self.cached.fetch_add(d.len() as u64, Ordering::Relaxed);
                    st.data = Some(ObjData::Fetched(d));
                }
            }
            match st.data.as_ref() {
                Some(d) => d.copy_out(at, &mut buf[r]),
                None => buf[r].fill(0),
            }
            Ok(())
        })
    }

    fn write(&self, off: u64, buf: &[u8]) -> BlockResult<()> {
        self.split(off, buf.len() as u64, |idx, at, r| {
            let s = self.slot(idx);
            if lock(&s.state).data.is_none() {
                self.make_room(self.object_size)?;
            }
            let mut st = lock(&s.state);
            let olen = object_len(self.size, self.object_size, idx) as usize;
            let len = r.len();
            match st.data.as_mut() {
                Some(d) => d.make_mut()[at..at + len].copy_from_slice(&buf[r]),
                None => {
                    let d = if at == 0 && len == olen {
                        // Read-ahead of the old contents would be stale once this is evicted.
                        lock(&self.inflight).remove(&idx);
                        buf[r].to_vec()
                    } else {
                        let mut d = if lock(&self.st.present).contains(&idx) {
                            self.fetch(idx)?.to_vec()
                        } else {
                            vec![0; olen]
                        };
                        d[at..at + len].copy_from_slice(&buf[r]);
                        d
                    };
                    self.cached.fetch_add(d.len() as u64, Ordering::Relaxed);
                    st.data = Some(ObjData::Owned(Arc::new(d)));
                }
            }
            st.dirty = true;
            st.generation += 1;
            let filled = self.write_behind && st.cover(at, len, olen);
            drop(st);
            if filled {
                self.st.write_behind(self.rt.handle(), idx, s, self.data_key(idx));
            }
            Ok(())
        })
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.ahead.stop();
        if !self.st.latch.is_latched() {
            if let Err(e) = self.flush() {
                log::error!("{}: write-back at close failed: {e}", self.loc.display());
            }
        }
        self.st.stop();
        if lock(&self.st.lease).take().is_some() {
            if let Err(e) = self.run("releasing the lease", || self.st.op.delete(&self.st.lease_key)) {
                log::warn!("{}: releasing the lease failed: {e}", self.loc.display());
            }
        }
    }
}

/// Makes an `Arc<Vec<u8>>` a `Bytes` owner without copying.
struct Shared(Arc<Vec<u8>>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// How many read-ahead downloads of `object_size` bytes run at once (at most `concurrency`,
/// at most `budget` bytes of them, at least one), and how many objects a sequential reader is
/// read ahead of (twice that, but no more than `cache` holds, never fewer than run at once).
fn ahead_sizes(concurrency: usize, budget: u64, object_size: u64, cache: u64) -> (u64, u64) {
    let osz = osz_nonzero(object_size);
    let running = (concurrency.max(1) as u64).min((budget / osz).max(1));
    (running, (2 * running).min((cache / osz).max(running)))
}

fn is_zero(b: &[u8]) -> bool {
    b.iter().all(|x| *x == 0)
}

fn osz_nonzero(o: u64) -> u64 {
    o.max(1)
}

fn object_len(size: u64, object_size: u64, idx: u64) -> u64 {
    let start = idx * object_size;
    object_size.min(size.saturating_sub(start))
}

fn manifest_json(size: u64, object_size: u64) -> Vec<u8> {
    serde_json::to_vec_pretty(&serde_json::json!({
        "format": "sealdisk-objstore",
        "version": 1,
        "size": size,
        "object_size": object_size,
        "block_size": BLOCK,
    }))
    .unwrap_or_default()
}

fn parse_manifest(bytes: &[u8]) -> Result<(u64, u64), String> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if v.get("format").and_then(|f| f.as_str()) != Some("sealdisk-objstore") {
        return Err("no \"format\": \"sealdisk-objstore\"".into());
    }
    if v.get("version").and_then(|f| f.as_u64()) != Some(1) {
        return Err(format!("version {:?} is not 1", v.get("version")));
    }
    let num = |k: &str| v.get(k).and_then(|f| f.as_u64()).ok_or_else(|| format!("no {k}"));
    let (size, osz, bs) = (num("size")?, num("object_size")?, num("block_size")?);
    if bs != u64::from(BLOCK) {
        return Err(format!("block_size {bs} is not {BLOCK}"));
    }
    if size == 0 || size % bs != 0 {
        return Err(format!("size {size} is not a nonzero multiple of {bs}"));
    }
    if !osz.is_power_of_two() || !(crate::MIN_OBJECT_SIZE..=crate::MAX_OBJECT_SIZE).contains(&osz) {
        return Err(format!("object_size {osz} is out of range"));
    }
    Ok((size, osz))
}

fn is_bucket_missing(e: &opendal::Error) -> bool {
    let s = e.to_string();
    s.contains("NoSuchBucket") || s.contains("ContainerNotFound")
}

fn describe_endpoint(loc: &Locator) -> String {
    match (&loc.endpoint, loc.service) {
        (Some(e), _) => e.clone(),
        (None, Service::S3) => std::env::var("AWS_ENDPOINT_URL").unwrap_or_else(|_| "AWS S3".into()),
        (None, Service::Gcs) => gcs_emulator().unwrap_or_else(|| "Google Cloud Storage".into()),
        (None, Service::Azblob) => "Azure Blob Storage".into(),
    }
}

/// Installs OpenDAL's process-wide HTTP transport (reqwest over native-tls) once; first
/// install wins, so a program that installed its own keeps it.
pub fn install_transport() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        opendal::HttpTransporter::install_default(opendal_http_transport_reqwest::ReqwestTransport::default())
    });
}

fn operator(loc: &Locator) -> BlockResult<Operator> {
    install_transport();
    let bad = |e: opendal::Error| err(BlockErrorKind::InvalidArgument, format!("{}: {e}", loc.display()));
    let op = match loc.service {
        Service::S3 => {
            let mut b = opendal::services::S3::default().bucket(&loc.bucket).root("/");
            if let Some(e) = &loc.endpoint {
                b = b.endpoint(e);
            }
            let region = loc
                .region
                .clone()
                .or_else(|| std::env::var("AWS_REGION").ok())
                .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
                .unwrap_or_else(|| "us-east-1".into());
            b = b.region(&region);
            if loc.virtual_host {
                b = b.enable_virtual_host_style();
            }
            Operator::new(b).map_err(bad)?
        }
        Service::Gcs => {
            let mut b = opendal::services::Gcs::default().bucket(&loc.bucket).root("/");
            // STORAGE_EMULATOR_HOST, as Google's own client libraries read it: a local GCS
            // emulator, reached without credentials.
            let emulator = gcs_emulator();
            if let Some(e) = loc.endpoint.as_ref().or(emulator.as_ref()) {
                b = b.endpoint(e);
            }
            if emulator.is_some() {
                b = b.skip_signature().disable_vm_metadata().disable_config_load();
            }
            Operator::new(b).map_err(bad)?
        }
        Service::Azblob => {
            let mut b = opendal::services::Azblob::default().container(&loc.bucket).root("/");
            if let Some(e) = &loc.endpoint {
                b = b.endpoint(e);
            }
            // The Azure CLI's names; OpenDAL's signer reads AZURE_STORAGE_ACCOUNT_NAME and
            // AZURE_STORAGE_ACCOUNT_KEY (and a SAS token) by itself.
            if let (Ok(name), Ok(key)) =
                (std::env::var("AZURE_STORAGE_ACCOUNT"), std::env::var("AZURE_STORAGE_KEY"))
            {
                b = b.account_name(&name).account_key(&key);
            }
            Operator::new(b).map_err(bad)?
        }
    };
    Ok(op)
}

/// Where the service's credentials come from, for messages.
fn credential_sources(service: Service) -> &'static str {
    match service {
        Service::S3 => "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/credentials",
        Service::Gcs => "GOOGLE_APPLICATION_CREDENTIALS, the VM's service account",
        Service::Azblob => {
            "AZURE_STORAGE_ACCOUNT/AZURE_STORAGE_KEY or AZURE_STORAGE_ACCOUNT_NAME/\
             AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN"
        }
    }
}

/// `STORAGE_EMULATOR_HOST` as an endpoint URL (`host:port` gets `http://`), when set.
fn gcs_emulator() -> Option<String> {
    let h = std::env::var("STORAGE_EMULATOR_HOST").ok().filter(|h| !h.trim().is_empty())?;
    let h = h.trim();
    Some(if h.contains("://") { h.to_owned() } else { format!("http://{h}") })
}

async fn retry<T, F, Fut>(timeout: Duration, what: &str, f: F) -> Result<T, opendal::Error>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, opendal::Error>>,
{
    let mut delay = Duration::from_millis(100);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let r = match tokio::time::timeout(timeout, f()).await {
            Ok(r) => r,
            Err(_) => {
                Err(opendal::Error::new(DalKind::Unexpected, format!("{what}: no answer in {timeout:?}"))
                    .set_temporary())
            }
        };
        match r {
            Err(e) if e.is_temporary() && attempt < 3 => {
                log::debug!("{what}: {e}; retrying");
                tokio::time::sleep(delay).await;
                delay *= 4;
            }
            r => return r,
        }
    }
}

fn run_on<T, F, Fut>(
    rt: &tokio::runtime::Runtime,
    timeout: Duration,
    what: &str,
    f: F,
) -> Result<T, opendal::Error>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, opendal::Error>>,
{
    rt.block_on(retry(timeout, what, f))
}

impl BlockDevice for ObjectDevice {
    fn geometry(&self) -> Geometry {
        Geometry { size: self.inner.size, logical_block: BLOCK, physical_block: 4096 }
    }

    fn caps(&self) -> Caps {
        if self.read_only {
            Caps::FLUSH | Caps::READ_ONLY
        } else {
            Caps::FLUSH | Caps::DISCARD
        }
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.geometry().check_range(off, buf.len() as u64)?;
        self.inner.read(off, buf)
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.geometry().check_range(off, buf.len() as u64)?;
        if self.read_only {
            return Err(BlockError::read_only());
        }
        self.inner.write(off, buf)?;
        if flags.contains(WriteFlags::FUA) {
            self.inner.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> BlockResult<()> {
        if self.read_only {
            return self.inner.st.latch.check("flush");
        }
        self.inner.flush()
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        // Reads as zeroes afterwards: a whole zero object is deleted at write-back.
        self.write_zeroes(off, len, blockdev::ZeroFlags::empty())
    }

    fn allocation(&self, off: u64, len: u64, max_extents: usize) -> BlockResult<Vec<Extent>> {
        self.geometry().check_range(off, len)?;
        let max = max_extents.max(1);
        let mut out: Vec<Extent> = Vec::new();
        let i = &self.inner;
        let mut done = false;
        i.split(off, len, |idx, at, r| {
            if done {
                return Ok(());
            }
            // Cached: zero or not by its bytes; else absent objects are holes reading zeroes.
            let slot = lock(&i.slots).get(&idx).cloned();
            let zero = slot.and_then(|s| lock(&s.state).data.as_ref().map(|d| d.is_zero(at, r.len())));
            let present = lock(&i.st.present).contains(&idx);
            let flags = match (zero, present) {
                (Some(true), false) | (None, false) => ExtentFlags::HOLE | ExtentFlags::ZERO,
                (Some(true), true) => ExtentFlags::ZERO,
                _ => ExtentFlags::empty(),
            };
            let n = r.len() as u64;
            let full = out.len() == max;
            match out.last_mut() {
                Some(last) if last.flags == flags => last.len += n,
                _ if full => done = true,
                _ => out.push(Extent { len: n, flags }),
            }
            Ok(())
        })?;
        Ok(out)
    }
}

impl ObjectDevice {
    /// The volume's object size in bytes.
    pub fn object_size(&self) -> u64 {
        self.inner.object_size
    }

    /// The locator without parameters (`s3://bucket/prefix`).
    pub fn name(&self) -> String {
        self.inner.loc.display()
    }

    /// Bytes held in the cache now.
    pub fn cached_bytes(&self) -> u64 {
        self.inner.cached.load(Ordering::Relaxed)
    }

    /// Write-behind uploads queued or running now.
    pub fn uploading(&self) -> usize {
        let u = lock(&self.inner.st.uploads);
        u.queue.len() + u.running
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_round_trip_and_refusals() {
        assert_eq!(parse_manifest(&manifest_json(1 << 30, 4 << 20)).unwrap(), (1 << 30, 4 << 20));
        for bad in [
            &b"{}"[..],
            b"not json",
            br#"{"format":"sealdisk-objstore","version":2,"size":512,"object_size":4194304,"block_size":512}"#,
            br#"{"format":"sealdisk-objstore","version":1,"size":100,"object_size":4194304,"block_size":512}"#,
            br#"{"format":"sealdisk-objstore","version":1,"size":512,"object_size":3,"block_size":512}"#,
        ] {
            assert!(parse_manifest(bad).is_err());
        }
        assert_eq!(object_len(10 << 20, 4 << 20, 2), 2 << 20);
        assert_eq!(object_len(8 << 20, 4 << 20, 1), 4 << 20);
    }

    #[test]
    fn an_object_is_filled_once_writes_cover_all_of_it() {
        let fill = |olen: usize, writes: &[(usize, usize)]| {
            let mut st = SlotState::default();
            writes.iter().map(|&(at, len)| st.cover(at, len, olen)).collect::<Vec<_>>()
        };
        // 1 MiB writes in order, and out of order, fill a 4 MiB object at the last one.
        let m = 1 << 20;
        assert_eq!(fill(4 * m, &[(0, m), (m, m), (2 * m, m), (3 * m, m)]), [false, false, false, true]);
        assert_eq!(fill(4 * m, &[(3 * m, m), (0, m), (2 * m, m), (m, m)]), [false, false, false, true]);
        // Writes that leave a gap (here a 4 KiB hole) do not; the sector that fills it does.
        assert_eq!(fill(4 * m, &[(0, 2 * m), (2 * m + 4096, 2 * m - 4096)]), [false, false]);
        assert_eq!(fill(64 << 10, &[(512, (64 << 10) - 512), (0, 512)]), [false, true]);
        assert_eq!(
            fill(64 << 10, &[(512, 1024), (0, 2048), (2048, (64 << 10) - 2048)]),
            [false, false, true]
        );
        // Sequential 4 KiB writes (a file system's) fill it too, and overlaps count once.
        let seq: Vec<(usize, usize)> = (0..1024).map(|k| (k * 4096, 4096)).collect();
        assert_eq!(fill(4 * m, &seq).iter().filter(|f| **f).count(), 1);
        assert_eq!(fill(4 * m, &[(0, 3 * m), (m, 2 * m), (3 * m - 512, m)]), [false, false, false]);
        let mut st = SlotState::default();
        assert!(!st.cover(0, 4 * m - 512, 4 * m));
        st.uncover();
        assert!(!st.cover(4 * m - 512, 512, 4 * m), "what was written before the upload began is forgotten");
        // Random 4 KiB writes over most of an object leave it unfilled.
        let mut st = SlotState::default();
        for k in (0..1024).filter(|k| k % 17 != 3) {
            assert!(!st.cover(k * 4096, 4096, 4 * m));
        }
        // An object shorter than 64 chunks (the volume's last, 5 sectors).
        assert_eq!(fill(2560, &[(0, 2048), (2048, 512)]), [false, true]);
        assert_eq!(fill(2560, &[(0, 2560)]), [true]);
    }

    /// A flush's claim on an object takes its queued write-behind over and waits for a
    /// running upload of it to end, so two uploads of one object never overlap (the older
    /// could land last).
    #[test]
    fn a_flush_claims_an_object_only_once_no_upload_has_it() {
        let op = Operator::new(
            opendal::services::S3::default().bucket("b").endpoint("http://127.0.0.1:9").region("us-east-1"),
        )
        .unwrap();
        let st = Store {
            op,
            timeout: Duration::from_secs(1),
            name: "s3://b".into(),
            endpoint: "http://127.0.0.1:9".into(),
            lease_key: LEASE.into(),
            limit: 8,
            present: Mutex::default(),
            lease: Mutex::default(),
            lost: AtomicBool::new(false),
            latch: WritebackLatch::new(),
            uploads: Mutex::default(),
            ended: Condvar::new(),
        };
        {
            let mut u = lock(&st.uploads);
            // Object 5's write-behind runs; object 7's waits in the queue.
            u.claimed.extend([5, 7]);
            u.running = 1;
            u.queue.push_back((7, Arc::default(), "data/7".into()));
        }
        st.claim(&[7]);
        assert!(lock(&st.uploads).queue.is_empty(), "the queued upload was taken over");
        let claimed = AtomicBool::new(false);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                st.claim(&[5, 6]);
                claimed.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(100));
            assert!(!claimed.load(Ordering::SeqCst), "claimed while object 5's upload ran");
            // The upload ends as a write-behind task ends it.
            {
                let mut u = lock(&st.uploads);
                u.running -= 1;
                u.claimed.remove(&5);
            }
            st.ended.notify_all();
        });
        assert!(claimed.load(Ordering::SeqCst));
        st.release(&[5, 6, 7]);
        assert!(lock(&st.uploads).claimed.is_empty());
    }

    #[test]
    fn read_ahead_is_capped_by_requests_and_by_bytes() {
        let (c, b, cache) = (crate::DEFAULT_CONCURRENCY, crate::DEFAULT_READAHEAD, 64 << 20);
        // The defaults: 8 downloads of 1 and 4 MiB objects (8 and 32 MiB), 2 of 16 MiB.
        assert_eq!(ahead_sizes(c, b, 1 << 20, cache), (8, 16));
        assert_eq!(ahead_sizes(c, b, 4 << 20, cache), (8, 16));
        assert_eq!(ahead_sizes(c, b, 16 << 20, cache), (2, 4));
        // Always one, even when one object is more than the budget; the window stays within
        // the cache.
        assert_eq!(ahead_sizes(c, b, 64 << 20, cache), (1, 1));
        assert_eq!(ahead_sizes(c, b, 64 << 20, 256 << 20), (1, 2));
        assert_eq!(ahead_sizes(c, 0, 1 << 20, cache), (1, 2));
        assert_eq!(ahead_sizes(3, 1 << 30, 1 << 20, cache), (3, 6));
    }

    /// A sequential reader's read-ahead against a real S3 server (moto) never has more than
    /// `readahead=` bytes (nor `concurrency=` requests) of downloads in flight, and reaches
    /// that cap (the downloads do run side by side).
    #[test]
    fn read_ahead_keeps_its_bytes_in_flight_under_the_cap() {
        use blockdev::{BlockDevice, WriteFlags};
        use testkit::pattern::pattern;
        use testkit::s3server::{S3Server, ACCESS_KEY, SECRET_KEY};
        let dir = tempfile::tempdir().unwrap();
        let Some(s) = S3Server::start(dir.path()) else {
            eprintln!("SKIP: moto_server is not installed");
            return;
        };
        s.create_bucket("vols");
        std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
        const OSZ: u64 = 256 << 10;
        const SIZE: u64 = 8 << 20;
        let base = format!("s3://vols/ra?endpoint={}&size={SIZE}&object_size={OSZ}&cache=8M", s.endpoint());
        let w = open(&base, OpenOptions::default()).unwrap();
        w.write_at(0, &pattern(5, 0, SIZE as usize), WriteFlags::empty()).unwrap();
        w.flush().unwrap();
        drop(w);
        // (parameters, the most bytes in flight expected)
        for (params, cap) in [
            ("readahead=512K", 2 * OSZ),
            ("readahead=700K", 2 * OSZ),
            // Less than one object: one at a time.
            ("readahead=100K", OSZ),
            // The request cap below the byte cap.
            ("concurrency=3&readahead=4M", 3 * OSZ),
        ] {
            let d =
                open(&format!("{base}&{params}"), OpenOptions { read_only: true, create: false }).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            for off in (0..SIZE).step_by(buf.len()) {
                d.read_at(off, &mut buf).unwrap();
                assert!(buf == pattern(5, off, buf.len()), "{params}: bytes at {off}");
            }
            let peak = lock(&d.inner.ahead.queue).peak_bytes;
            assert_eq!(peak, cap, "{params}: the most bytes of read-ahead in flight");
        }
    }
}
