//! `luksSuspend NAME` / `luksResume NAME`: requests held and the stack (with every key)
//! dropped; the stack unlocked again from the header with a passphrase and swapped in.

use super::*;

impl Live {
    pub(super) fn suspend(&self) -> Response {
        if lock(&self.reenc).running() {
            return Response::err(
                exit::BUSY,
                format!("Device {} is being reencrypted: it cannot be suspended now.", self.name),
            );
        }
        let mut guard = lock(&self.rebuild);
        let luks = guard.as_ref().and_then(|r| r.luks.as_ref());
        if luks.is_none() {
            return Response::err(
                exit::BAD_ARGS,
                format!("Device {} is not a LUKS device: luksSuspend works on LUKS volumes only.", self.name),
            );
        }
        if self.gate.is_held() {
            return Response::err(exit::BAD_ARGS, format!("Volume {} is already suspended.", self.name));
        }
        let Some(old) = self.gate.hold() else {
            return Response::err(exit::BAD_ARGS, format!("Volume {} is already suspended.", self.name));
        };
        if let Err(e) = old.flush() {
            drop(self.gate.replace(old));
            return Response::err(
                exit::FAILURE,
                format!("flushing {} failed, not suspended: {e}", self.name),
            );
        }
        // The stack, and with it every key schedule, goes here: nothing else refers to it
        // (the gate held it alone, and `hold` waited for the last request).
        drop(old);
        if let Some(r) = guard.as_mut() {
            r.table = None;
        }
        // Stack temporaries of the key schedules (cipher backends leave some) on the crypto
        // pool's threads and this one.
        targets::scrub_crypto_stacks();
        log::info!("{}: suspended, key wiped", self.name);
        Response::ok()
    }

    pub(super) fn resume(&self, pass: Passphrase) -> Response {
        let mut guard = lock(&self.rebuild);
        let Some(r) = guard.as_mut() else {
            return Response::err(exit::BAD_ARGS, format!("Device {} is not a LUKS device.", self.name));
        };
        let Some(l) = r.luks.clone() else {
            return Response::err(exit::BAD_ARGS, format!("Device {} is not a LUKS device.", self.name));
        };
        if !self.gate.is_held() {
            return Response::err(exit::BAD_ARGS, format!("Volume {} is not suspended.", self.name));
        }
        let mut one = OnePassphrase::new(&pass);
        let spec = LuksSpec {
            version: Some(l.version),
            header: r.header.clone(),
            key_slot: None,
            flags: r.flags,
            integrity_no_journal: l.integrity_no_journal,
            integrity_journal: l.integrity_journal,
            kdf_limits: l.kdf_limits,
        };
        let vol = match volume::open_storage(
            r.storage.clone(),
            Spec::Luks(spec),
            Keys::passphrase(&mut one),
            &r.opts,
        ) {
            Ok(v) => v,
            Err(e) => {
                let code = crate::actions::luks::kind_code(e.kind());
                let msg = match e.kind() {
                    volume::ErrorKind::WrongKey => "No key available with this passphrase.".to_owned(),
                    _ => format!("resuming {}: {e}", self.name),
                };
                return Response::err(code, msg);
            }
        };
        if vol.luks.as_ref().map(|u| u.luks.uuid()) != Some(l.uuid.as_str()) {
            return Response::err(
                exit::FAILURE,
                "the LUKS header now on the device has another UUID: not resumed",
            );
        }
        if !self.gate.fits(&*vol.device) {
            return Response::err(
                exit::FAILURE,
                "the volume now differs in size or capabilities: not resumed",
            );
        }
        r.table = match vol.kind {
            VolumeKind::Luks2Aead => None,
            _ => vol.crypt_table().cloned(),
        };
        let Volume { device, .. } = vol;
        drop(self.gate.replace(device));
        log::info!("{}: resumed", self.name);
        Response::ok()
    }
}
