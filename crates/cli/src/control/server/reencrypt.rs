//! `reencrypt NAME` of a running LUKS2 volume: the run on its own thread beside the I/O,
//! its progress in `status`, the finished volume adopted as the one table.

use super::*;

impl Live {
    /// After an online reencryption finished, the new segment's table is the volume's
    /// (so `refresh` and `resize` rebuild from it again).
    pub(super) fn adopt_reencrypted(&self, r: Option<&mut Rebuild>) {
        let mut j = lock(&self.reenc);
        if j.progress.as_ref().is_some_and(|p| p.state == "finished") {
            if let (Some(r), Some(t)) = (r, j.new_table.take()) {
                r.table = Some(t);
            }
        }
    }

    /// Stops the online reencryption, if one runs, after its current hotzone, and waits
    /// for it (its header is then resumable by any tool).
    pub(super) fn stop_reencryption(&self) {
        let thread = {
            let mut j = lock(&self.reenc);
            j.stop.store(true, Ordering::SeqCst);
            j.thread.take()
        };
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// `reencrypt` of the served volume (cryptsetup's online reencryption): initializes it
    /// unless one is in progress, puts a [`volume::luks::reencrypting::ReencryptingDevice`]
    /// in the gate, and runs the hotzones on a thread while clients go on.
    pub(super) fn reencrypt(&self, pass: Passphrase, q: &proto::Reencrypt) -> Response {
        use volume::luks::reencrypt::{self as re, ReencryptParams, RunEnd, RunOptions};
        let mut job = lock(&self.reenc);
        if job.running() {
            return Response::err(exit::BUSY, "Reencryption process is already running.");
        }
        let mut guard = lock(&self.rebuild);
        let not_luks =
            || Response::err(exit::BAD_ARGS, format!("Device {} is not a LUKS2 device.", self.name));
        let Some(r) = guard.as_mut() else { return not_luks() };
        let Some(l) = r.luks.clone() else { return not_luks() };
        if l.version != LuksVersion::V2 {
            return Response::err(
                exit::BAD_ARGS,
                "Reencryption is supported only for LUKS2 in this version of sealdisk.",
            );
        }
        if self.gate.is_held() {
            return Response::err(exit::BUSY, format!("Device {} is suspended.", self.name));
        }
        if r.opts.read_only {
            return Response::err(
                exit::BAD_ARGS,
                format!("Device {} is active read-only: it cannot be reencrypted online.", self.name),
            );
        }
        if q.sector_size.is_some() {
            return Response::err(
                exit::BAD_ARGS,
                "changing the sector size of an active volume is not supported online: close it and reencrypt offline",
            );
        }
        let fail = |e: volume::luks::LuksError| {
            let code = crate::actions::luks::kind_code(e.kind());
            let msg = match e.kind() {
                volume::ErrorKind::WrongKey => "No key available with this passphrase.".to_owned(),
                _ => e.to_string(),
            };
            Response::err(code, msg)
        };
        let mut meta = r.header.clone().unwrap_or_else(|| r.storage.clone());
        let mut luks = match volume::luks::Luks::load(&*meta.device, false) {
            Ok(h) => h,
            Err(e) => return fail(e),
        };
        if luks.uuid() != l.uuid {
            return Response::err(
                exit::FAILURE,
                "the LUKS header now on the device has another UUID: refused",
            );
        }
        // `--decrypt --header NEW` of a volume whose header is on the device (cryptsetup's
        // data-shift decryption, which it starts under an active device too): with the
        // clients held, the header moves to NEW and the first data segment to the device's
        // start; they go on only once the device mid-decryption has replaced the served one
        // (below), since the old mapping no longer holds for the moved segment.
        let mut held = HeldGate { gate: &self.gate, old: None };
        if let Some(path) = &q.decrypt_header {
            if r.header.is_some() || q.init_only {
                let why = if q.init_only {
                    "--init-only of a data-shift decryption on an active device is not supported: start it \
                     without --init-only, or close the device first"
                } else {
                    "the device's LUKS2 header is detached: decrypt it with --header naming that header"
                };
                return Response::err(exit::BAD_ARGS, why);
            }
            match self.start_decrypt_shift(r, &pass, q, &l.kdf_limits, path) {
                Ok((m, lk, old)) => {
                    meta = m;
                    luks = lk;
                    held.old = Some(old);
                }
                Err(resp) => return *resp,
            }
        }
        let in_progress = match re::status(&luks) {
            Ok(s) => s.is_some(),
            Err(e) => return fail(e),
        };
        if in_progress && q.init_only {
            return Response::err(
                exit::BAD_ARGS,
                "LUKS2 reencryption already initialized. Aborting operation.",
            );
        }
        if !in_progress {
            if q.resume_only {
                return Response::err(exit::BAD_ARGS, "Device reencryption not in progress.");
            }
            let params = match reencrypt_params(q, l.kdf_limits) {
                Ok(p) => ReencryptParams { cipher: q.cipher.clone(), key_bytes: q.key_bytes, ..p },
                Err(r) => return *r,
            };
            match re::init(&*meta.device, r.storage.size(), &mut luks, &pass, &params) {
                Ok(slot) => log::info!("{}: reencryption initialized, new key in keyslot {slot}", self.name),
                Err(e) => return fail(e),
            }
            if q.init_only {
                // Every sector is still in the old segment: the served stack stays right.
                return Response::ok();
            }
        } else if let (Some(res), None) = (&q.resilience, &held.old) {
            let cur = re::status(&luks).ok().flatten().map(|s| s.keyslot.resilience.type_name());
            if cur != Some(res.as_str()) {
                return Response::err(
                    exit::BAD_ARGS,
                    "changing the resilience mode on resume is not supported yet.",
                );
            }
        }
        let keys = match re::unlock_keys(&*meta.device, &luks, &pass, &l.kdf_limits) {
            Ok(k) => k,
            Err(e) => return fail(e),
        };
        // A data shift (encryption with --reduce-device-size, decryption into a new header
        // file) runs online too: the run holds each hotzone, whose source and destination
        // are live for no position outside it (see `run_datashift` / `run_decrypt_shift`).
        // The device for both segments replaces the served one between requests.
        let started = held.old.is_some();
        let Some(old) = held.old.take().or_else(|| self.gate.hold()) else {
            return Response::err(exit::BUSY, format!("Device {} is suspended.", self.name));
        };
        let built = volume::luks::reencrypting::activate(
            &r.storage,
            &*meta.device,
            &mut luks,
            &keys,
            &r.opts,
            &r.flags,
        );
        let (dev, new_table) = match built {
            Ok((d, tn, _)) if self.gate.fits(&*d) => (d, tn.crypt()),
            Ok(_) if started => {
                // The old mapping no longer holds for the moved segment: fail I/O instead.
                self.gate.close_held();
                return Response::err(
                    exit::FAILURE,
                    "the volume mid data-shift decryption differs in size: closed",
                );
            }
            Ok(_) => {
                drop(self.gate.replace(old));
                return Response::err(
                    exit::FAILURE,
                    "the reencrypting volume differs in size or capabilities: refused",
                );
            }
            Err(e) if started => {
                self.gate.close_held();
                return Response::err(crate::actions::luks::kind_code(e.kind()), format!("{e}"));
            }
            Err(e) => {
                drop(self.gate.replace(old));
                return Response::err(crate::actions::luks::kind_code(e.kind()), format!("{e}"));
            }
        };
        drop(self.gate.replace(dev.clone()));
        drop(old);
        // One crypt table cannot rebuild this volume any more (`refresh`, `resize`).
        r.table = None;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        job.stop = stop.clone();
        job.new_table = new_table;
        job.progress = Some(ReencryptProgress { state: "running".into(), ..ReencryptProgress::default() });
        let shared = self.reenc.clone();
        let (meta_dev, data) = (meta.device.clone(), r.storage.device.clone());
        let opts = RunOptions { hotzone_size: q.hotzone_size, kdf_limits: l.kdf_limits };
        let name = self.name.clone();
        let spawned = std::thread::Builder::new().name("reencrypt".into()).spawn(move || {
            let t0 = std::time::Instant::now();
            let mut first = None;
            let mut update = |done: u64, total: u64| {
                let f = *first.get_or_insert(done);
                let rate = (done - f) as f64 / t0.elapsed().as_secs_f64().max(1e-3);
                let eta = if rate > 0.0 { (total.saturating_sub(done) as f64 / rate) as u64 } else { 0 };
                if let Some(p) = lock(&shared).progress.as_mut() {
                    (p.done, p.total, p.rate, p.eta_secs) = (done, total, rate, eta);
                }
            };
            let r =
                re::run_unlocked(&*meta_dev, &*data, &mut luks, &keys, &opts, Some(&*dev), &mut |d, t| {
                    update(d, t);
                    !stop.load(Ordering::SeqCst)
                });
            drop(keys);
            let mut j = lock(&shared);
            if let Some(p) = j.progress.as_mut() {
                match r {
                    Ok(RunEnd::Finished) => {
                        p.state = "finished".into();
                        p.eta_secs = 0;
                        log::info!("{name}: reencryption finished");
                    }
                    Ok(RunEnd::Interrupted) => {
                        p.state = "interrupted".into();
                        log::info!("{name}: reencryption interrupted at {} of {} bytes", p.done, p.total);
                    }
                    Err(e) => {
                        log::error!("{name}: reencryption failed: {e}");
                        p.state = "failed".into();
                        p.error = Some(e.to_string());
                    }
                }
            }
        });
        match spawned {
            Ok(t) => job.thread = Some(t),
            Err(e) => {
                job.progress = None;
                return Response::err(exit::FAILURE, format!("starting the reencryption thread: {e}"));
            }
        }
        Response::ok()
    }

    /// Starts the data-shift decryption of the served volume (header on the device) into
    /// the new header file `path` (created here, 0600, as long as the header and its
    /// keyslots area): holds the clients, runs the start (`init_decrypt_shift`, its words
    /// and refusals), and returns the new header, the header state and the served device
    /// with the clients still held. On a refusal the clients go on and no file is left
    /// unless the device's header is already gone (the copy in it is then the only one).
    pub(super) fn start_decrypt_shift(
        &self,
        r: &mut Rebuild,
        pass: &Passphrase,
        q: &proto::Reencrypt,
        limits: &KdfLimits,
        path: &str,
    ) -> Result<(Storage, volume::luks::Luks, Arc<dyn blockdev::BlockDevice>), Box<Response>> {
        use std::os::unix::fs::OpenOptionsExt;
        use volume::luks::reencrypt::{self as re, EncryptLayout, ReencryptParams};
        let fail = |e: volume::luks::LuksError| {
            Response::err(crate::actions::luks::kind_code(e.kind()), e.to_string())
        };
        let hdr_len = match volume::luks::Luks::load(&*r.storage.device, false) {
            Ok(l) => match &l.header {
                volume::luks::LuksHeader::V2(s) => s.header.metadata.metadata_and_keyslots_size(),
                volume::luks::LuksHeader::V1(_) => {
                    return Err(Box::new(Response::err(
                        exit::BAD_ARGS,
                        "Reencryption is supported only for LUKS2 in this version of sealdisk.",
                    )))
                }
            },
            Err(e) => return Err(Box::new(fail(e))),
        };
        let params = ReencryptParams {
            layout: EncryptLayout { hotzone_size: q.hotzone_size, ..EncryptLayout::default() },
            ..reencrypt_params(q, *limits)?
        };
        let made = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .and_then(|f| f.set_len(hdr_len));
        if let Err(e) = made {
            return Err(Box::new(Response::err(
                exit::FAILURE,
                format!("creating the header file {path}: {e}"),
            )));
        }
        let opts = OpenOptions { read_only: false, lock: true, ..OpenOptions::default() };
        let new = match volume::storage::open(path, &opts.storage()) {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(Box::new(Response::err(
                    exit::FAILURE,
                    format!("opening the header file {path}: {e}"),
                )));
            }
        };
        let Some(old) = self.gate.hold() else {
            let _ = std::fs::remove_file(path);
            return Err(Box::new(Response::err(exit::BUSY, format!("Device {} is suspended.", self.name))));
        };
        match re::init_decrypt_shift(&*new.device, &*r.storage.device, pass, &params) {
            Ok(luks) => {
                log::info!("{}: data-shift decryption started, header moved to {path}", self.name);
                r.header = Some(new.clone());
                Ok((new, luks, old))
            }
            Err(e) => {
                let device_header_kept = volume::luks::probe(&*r.storage.device).ok().flatten().is_some();
                drop(self.gate.replace(old));
                if device_header_kept {
                    drop(new);
                    let _ = std::fs::remove_file(path);
                }
                Err(Box::new(fail(e)))
            }
        }
    }
}

/// The reencryption parameters a request asks for (resilience, keyslot, PBKDF of the new
/// keyslot), or the response refusing it: an unknown PBKDF or hash.
pub(super) fn reencrypt_params(
    q: &proto::Reencrypt,
    kdf_limits: volume::luks::KdfLimits,
) -> Result<volume::luks::reencrypt::ReencryptParams, Box<Response>> {
    let kind = match &q.pbkdf {
        Some(k) => Some(
            k.parse::<volume::luks::PbkdfType>()
                .map_err(|e| Box::new(Response::err(exit::BAD_ARGS, e.to_string())))?,
        ),
        None => None,
    };
    let Ok(hash) = q.hash.parse() else {
        return Err(Box::new(Response::err(exit::BAD_ARGS, format!("--hash: unknown hash {:?}", q.hash))));
    };
    Ok(volume::luks::reencrypt::ReencryptParams {
        resilience: q.resilience.clone().unwrap_or_else(|| "checksum".into()),
        resilience_hash: q.resilience_hash.clone(),
        key_slot: q.key_slot,
        pbkdf: volume::luks::PbkdfParams {
            kind,
            hash,
            iter_time: Duration::from_millis(q.iter_time_ms.max(1)),
            force_iterations: q.pbkdf_force_iterations,
            memory_kib: q.pbkdf_memory,
            parallel: q.pbkdf_parallel,
        },
        kdf_limits,
        ..Default::default()
    })
}
