//! Shared helpers for the integrity engine tests: format (+ wipe) a device and open it.
#![allow(dead_code)]

use std::sync::Arc;

use blockdev::{BlockDevice, MemDevice};
use formats::integrity::FormatParams;
use sector_crypto::tag::TagHash;
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};
use targets::integrity::{format, FormatOptions, IntegrityConfig, IntegrityTarget, Mode};
use targets::{CryptConfig, CryptTarget};

/// One volume shape.
#[derive(Debug, Clone)]
pub struct Shape {
    pub alg: &'static str,
    pub key: Option<Vec<u8>>,
    pub block: u32,
    pub tag_size: Option<u32>,
    pub interleave: u32,
    pub journal_sectors: Option<u32>,
    pub fix_padding: bool,
    pub journal_mac: Option<(&'static str, Vec<u8>)>,
}

impl Shape {
    pub fn new(alg: &'static str, block: u32) -> Self {
        let key = alg.starts_with("hmac").then(|| (0..32u8).collect());
        Shape {
            alg,
            key,
            block,
            tag_size: None,
            interleave: 32768,
            journal_sectors: None,
            fix_padding: true,
            journal_mac: None,
        }
    }
    pub fn hash(&self) -> TagHash {
        TagHash::new(self.alg, self.key.as_deref()).unwrap()
    }
    pub fn mac(&self) -> Option<TagHash> {
        self.journal_mac.as_ref().map(|(a, k)| TagHash::new(a, Some(k)).unwrap())
    }
    pub fn config(&self, mode: Mode) -> IntegrityConfig {
        let mut c = IntegrityConfig::new(mode, Some(self.hash()));
        c.block_size = self.block;
        c.tag_size = self.tag_size;
        c.journal_mac = self.mac();
        c.commit_time_ms = 0;
        c.bitmap_flush_interval_ms = 0;
        c
    }
    pub fn format_options(&self) -> FormatOptions {
        let tag = self.tag_size.unwrap_or(self.hash().digest_size() as u32);
        let mut p = FormatParams::new(tag, self.block);
        p.interleave_sectors = self.interleave;
        p.journal_sectors = self.journal_sectors;
        p.fix_padding = self.fix_padding;
        p.salt = [0x5a; 16];
        FormatOptions {
            params: p,
            start: 0,
            buffer_sectors: 128,
            sectors_per_bit: None,
            journal_mac: self.mac(),
            journal_crypt: None,
        }
    }
    /// Formats `dev` and wipes it (zeroes with valid tags).
    pub fn format<D: BlockDevice + 'static>(&self, dev: Arc<D>) {
        format(&*dev, &self.format_options()).unwrap();
        let t = IntegrityTarget::open(dev, self.config(Mode::Direct)).unwrap();
        t.wipe(|_, _| {}).unwrap();
        t.close().unwrap();
    }
    /// A fresh formatted memory device of `size` bytes.
    pub fn mem(&self, size: u64) -> Arc<MemDevice> {
        let dev = Arc::new(MemDevice::new(size, 512));
        self.format(dev.clone());
        dev
    }
    pub fn open<D: BlockDevice + 'static>(&self, dev: D, mode: Mode) -> IntegrityTarget<D> {
        IntegrityTarget::open(dev, self.config(mode)).unwrap()
    }
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    testkit::pattern::pattern(seed, 0, len)
}

/// aes-xts-plain64 with a fixed 512-bit key and 4096-byte sectors over `below` (default knobs).
pub fn xts4096<D: BlockDevice>(below: D) -> CryptTarget<D> {
    let spec: CipherSpec = "aes-xts-plain64".parse().unwrap();
    let key = VolumeKey::new((0..64u8).collect());
    let params = SectorParams { sector_size: 4096, iv_offset: 0, iv_large_sectors: false };
    let c = SectorCipher::new(&spec, &key, params).unwrap();
    CryptTarget::new(below, c, CryptConfig::default()).unwrap()
}
