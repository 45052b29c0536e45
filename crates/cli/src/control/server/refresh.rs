//! `refresh NAME`: the running volume's `--perf-*` flags (and `--crypt-mode`) changed by
//! rebuilding its stack from its one crypt table on the same storage and swapping it in.

use super::*;

impl Live {
    /// Whether `refresh` and `resize` take this volume on: plain dm-crypt and LUKS (an
    /// authenticated LUKS2 volume goes on to their own refusal in cryptsetup's words; a
    /// standalone integrity volume grows through its regrow). Other kinds are refused at once.
    pub(super) fn rebuildable(&self) -> bool {
        self.kind.rebuilds_from_its_table() || self.kind == VolumeKind::Luks2Aead
    }

    pub(super) fn refresh(&self, want: &Refresh) -> Response {
        let mut guard = lock(&self.rebuild);
        self.adopt_reencrypted(guard.as_mut());
        let Some(r) = guard.as_mut().filter(|_| self.rebuildable()) else {
            return Response::err(
                exit::BAD_ARGS,
                format!("Device {} ({}) has no crypt flags to refresh.", self.name, self.base.kind),
            );
        };
        if self.gate.is_held() {
            return Response::err(exit::BUSY, format!("Device {} is suspended.", self.name));
        }
        let Some(table) = &r.table else {
            // Why there is no one table to rebuild from: a reencryption (two segments, two
            // keys, and the keys are not kept) or an authenticated segment.
            if lock(&self.reenc).running() {
                return Response::err(
                    exit::BUSY,
                    format!(
                        "Device {} is being reencrypted: its flags cannot be refreshed until the reencryption \
                         finishes (`sealdisk status {}` shows its progress).",
                        self.name, self.name
                    ),
                );
            }
            if self.base.integrity.is_none() {
                return Response::err(
                    exit::BAD_ARGS,
                    format!(
                        "refresh of {} is not supported while its LUKS2 reencryption is unfinished (two segments, \
                         two keys): finish it (`sealdisk reencrypt --resume-only`), or close the volume and open it \
                         again with the new flags",
                        self.name
                    ),
                );
            }
            return Response::err(
                exit::BAD_ARGS,
                format!(
                    "refresh of {} is not supported: an authenticated (integrity) volume's flags cannot be changed live",
                    self.name
                ),
            );
        };
        if want.allow_discards != r.flags.allow_discards {
            return Response::err(
                exit::BAD_ARGS,
                "--allow-discards cannot be changed on a running volume: clients were told at connect \
                 whether it takes TRIM (close and open it again)",
            );
        }
        let mut opts = r.opts;
        if let Some(m) = &want.crypt_mode {
            match m.parse::<volume::CryptMode>().ok() {
                Some(m) => opts.crypt_mode = m,
                None => return Response::err(exit::BAD_ARGS, format!("invalid --crypt-mode {m:?}")),
            }
        }
        let mut t = table.clone();
        t.options.same_cpu_crypt = want.same_cpu_crypt;
        t.options.submit_from_crypt_cpus = want.submit_from_crypt_cpus;
        t.options.no_read_workqueue = want.no_read_workqueue;
        t.options.no_write_workqueue = want.no_write_workqueue;
        let vol = match volume::open_storage(r.storage.clone(), Spec::Table(t.clone()), Keys::none(), &opts) {
            Ok(v) => v,
            Err(e) => return Response::err(exit::FAILURE, format!("rebuilding {}: {e}", self.name)),
        };
        if !self.gate.fits(&*vol.device) {
            return Response::err(
                exit::FAILURE,
                "the rebuilt volume differs in size or capabilities: refused",
            );
        }
        let Volume { device, .. } = vol;
        // A request boundary: requests running finish on the old stack, new ones take this.
        drop(self.gate.replace(device));
        r.flags = CryptOptions { integrity_aead: None, ..t.options };
        r.opts = opts;
        r.table = Some(t);
        log::info!("{}: refreshed (flags: {:?})", self.name, flag_words(&r.flags));
        Response::ok()
    }
}
