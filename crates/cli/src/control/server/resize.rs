//! `resize NAME`: a plain or LUKS volume rebuilt at its new size on the storage measured
//! again; a standalone integrity volume grown (recalculated or wiped) by `volume::integrity::regrow`.

use super::*;

impl Live {
    pub(super) fn resize(&self, sectors: Option<u64>, wipe: bool) -> Response {
        if let Some(g) = lock(&self.regrow).as_mut() {
            return self.resize_integrity(g, sectors, wipe);
        }
        if wipe {
            return Response::err(exit::BAD_ARGS, "--wipe applies to integrity volumes only");
        }
        let mut guard = lock(&self.rebuild);
        self.adopt_reencrypted(guard.as_mut());
        let Some(r) = guard.as_mut().filter(|_| self.rebuildable()) else {
            return Response::err(
                exit::BAD_ARGS,
                format!("Device {} ({}) cannot be resized.", self.name, self.base.kind),
            );
        };
        if self.gate.is_held() {
            return Response::err(exit::BUSY, format!("Device {} is suspended.", self.name));
        }
        let Some(table) = &r.table else {
            if self.base.integrity.is_some() {
                // cryptsetup 2.6.1's refusal, as its `resize` of a LUKS2 --integrity volume
                // answers on Linux 6.1 (grow, shrink or no size alike; exit 1; seen in the
                // oracle). cryptsetup 2.8 says "Resize of LUKS2 device with integrity
                // protection is not supported." instead. A grown dm-integrity area would
                // also need tags for its new sectors.
                return Response::err(
                    exit::BAD_ARGS,
                    format!("Unsupported parameters on device {}.", self.name),
                );
            }
            return Response::err(
                exit::BAD_ARGS,
                format!("Device {} ({}) cannot be resized.", self.name, self.base.kind),
            );
        };
        // The storage as it is now: grown (or shrunk) underneath since it was opened.
        let storage = match r.storage.remeasured() {
            Ok(s) => s,
            Err(e) => {
                return Response::err(exit::FAILURE, format!("reading the size of {}: {e}", r.storage.name))
            }
        };
        // cryptsetup's device_block_adjust, with its messages: the data must start inside the
        // device, and the mapping must end inside it; `--size 0` (or none) means the rest of
        // the device.
        let too_small = || Response::err(exit::BAD_ARGS, format!("Device {} is too small.", storage.name));
        let device_sectors = storage.size() / 512;
        if table.offset >= device_sectors {
            return Response::err(
                exit::BAD_ARGS,
                format!("Requested offset is beyond real size of device {}.", storage.name),
            );
        }
        let avail = device_sectors - table.offset;
        let len = sectors.filter(|&s| s != 0).unwrap_or(avail);
        let block = u64::from(table.options.sector_size() / 512).max(1);
        if !len.is_multiple_of(block) {
            return Response::err(exit::BAD_ARGS, "Device size is not aligned to requested sector size.");
        }
        if len > avail {
            return too_small();
        }
        let mut t = table.clone();
        t.len = len;
        let vol = match volume::open_storage(storage.clone(), Spec::Table(t.clone()), Keys::none(), &r.opts) {
            Ok(v) => v,
            Err(e) => return Response::err(exit::FAILURE, format!("rebuilding {}: {e}", self.name)),
        };
        if !self.gate.fits_resized(&*vol.device) {
            return Response::err(
                exit::FAILURE,
                "the resized volume differs in block size or capabilities: refused",
            );
        }
        let bytes = vol.device.geometry().size;
        let hook = self.transport.get().and_then(|t| t.resized.as_ref());
        let growing = bytes >= self.gate.geometry().size;
        if let (Some(h), false) = (hook, growing) {
            // Shrinking: the kernel stops sending requests past the new end first.
            if let Err(e) = h(bytes) {
                return Response::err(exit::FAILURE, format!("resizing {}: {e}", self.name));
            }
        }
        let Volume { device, .. } = vol;
        drop(self.gate.replace_resized(device));
        r.table = Some(t);
        r.storage = storage;
        if let (Some(h), true) = (hook, growing) {
            if let Err(e) = h(bytes) {
                log::warn!(
                    "{}: resized to {len} sectors, but its {} device was not told: {e}",
                    self.name,
                    self.transport.get().map_or("", |t| t.kind)
                );
                return Response::err(
                    exit::FAILURE,
                    format!(
                        "{} was resized to {len} sectors, but the kernel's device keeps its old size: {e}",
                        self.name
                    ),
                );
            }
        }
        log::info!("{}: resized to {len} sectors", self.name);
        Response::ok()
    }

    /// `resize NAME` of a standalone integrity volume (integritysetup's `resize`): the
    /// storage measured again; requests held while the target closes, the superblock is
    /// marked for recalculation of the new area (or the area wiped, `wipe`), and the target
    /// opens again at the new size (`volume::integrity::regrow`). `--size` maps fewer
    /// sectors than the volume provides (a window of it); more are refused with
    /// cryptsetup's "Device ... is too small.".
    pub(super) fn resize_integrity(&self, g: &mut IntegrityRegrow, sectors: Option<u64>, wipe: bool) -> Response {
        if self.gate.is_held() {
            return Response::err(exit::BUSY, format!("Device {} is suspended.", self.name));
        }
        if g.params.read_only {
            return Response::err(
                exit::BAD_ARGS,
                format!("Device {} is read-only: it cannot be resized.", self.name),
            );
        }
        let Some(cur) = lock(&g.current).clone() else {
            return Response::err(exit::FAILURE, format!("Device {} has no integrity target.", self.name));
        };
        let storage = match g.storage.remeasured() {
            Ok(s) => s,
            Err(e) => {
                return Response::err(exit::FAILURE, format!("reading the size of {}: {e}", g.storage.name))
            }
        };
        let sb = cur.superblock();
        let provided = volume::integrity::provided_on(&sb, &g.params, storage.size() / 512);
        if !wipe && provided > sb.provided_data_sectors {
            match volume::integrity::recalculate_refused(&sb, &g.params) {
                Ok(false) => {}
                Ok(true) => {
                    return Response::err(
                        exit::BAD_ARGS,
                        "Setting recalculate flag is not supported, you may consider using --wipe instead.",
                    )
                }
                Err(e) => return Response::err(exit::FAILURE, format!("{:#}", anyhow::Error::new(e))),
            }
        }
        drop(cur);
        let len = sectors.filter(|&s| s != 0).unwrap_or(provided);
        let block = u64::from(sb.block_size() / 512).max(1);
        if !len.is_multiple_of(block) {
            return Response::err(exit::BAD_ARGS, "Device size is not aligned to requested sector size.");
        }
        if len > provided {
            return Response::err(exit::BAD_ARGS, format!("Device {} is too small.", storage.name));
        }
        let bytes = len * 512;
        let hook = self.transport.get().and_then(|t| t.resized.as_ref());
        let growing = bytes >= self.gate.geometry().size;
        if let (Some(h), false) = (hook, growing) {
            if let Err(e) = h(bytes) {
                return Response::err(exit::FAILURE, format!("resizing {}: {e}", self.name));
            }
        }
        // Suspend: no request runs on the old target, and nothing else holds it.
        drop(self.gate.hold());
        let mut slot = lock(&g.current).take();
        let old = loop {
            match slot.map(Arc::try_unwrap) {
                Some(Ok(t)) => break Some(t),
                Some(Err(again)) => {
                    slot = Some(again);
                    std::thread::sleep(Duration::from_millis(1));
                }
                None => break None,
            }
        };
        let Some(old) = old else {
            return Response::err(exit::FAILURE, format!("Device {} has no integrity target.", self.name));
        };
        let (target, outcome) = match volume::integrity::regrow(old, &storage, &g.params, wipe) {
            Ok((t, rep)) => (Ok(t), Ok(rep)),
            Err(e) => {
                // Serve the volume again as it is now on disk.
                let msg = format!("{:#}", anyhow::Error::new(e));
                let t = volume::integrity::open_on(storage.device.clone(), &storage.name, &g.params);
                (
                    t.map_err(|e| format!("{msg}; reopening it failed too: {:#}", anyhow::Error::new(e))),
                    Err(msg),
                )
            }
        };
        let target = match target {
            Ok(t) => t,
            Err(msg) => {
                // Nothing to serve: requests fail from now on.
                self.gate.close_held();
                return Response::err(exit::FAILURE, format!("resizing {}: {msg}", self.name));
            }
        };
        let size = target.geometry().size;
        let device: Arc<dyn BlockDevice> = if bytes < size && outcome.is_ok() {
            match blockdev::Slice::new(target.clone(), 0, bytes) {
                Ok(s) => Arc::new(s),
                Err(_) => target.clone(),
            }
        } else {
            target.clone()
        };
        *lock(&g.current) = Some(target);
        g.storage = storage;
        let served = device.geometry().size;
        drop(self.gate.replace_resized(device));
        if let Some(h) = hook {
            if let Err(e) = h(served) {
                log::warn!("{}: resized, but its transport was not told: {e}", self.name);
            }
        }
        match outcome {
            Ok(rep) => {
                log::info!(
                    "{}: integrity volume resized to {} sectors (provided {} -> {}, new area {})",
                    self.name,
                    served / 512,
                    rep.old_sectors,
                    rep.new_sectors,
                    if rep.wiped { "wiped" } else { "being recalculated" }
                );
                Response::ok()
            }
            Err(msg) => Response::err(exit::BAD_ARGS, msg),
        }
    }
}
