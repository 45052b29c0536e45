//! Shared by `durability.rs` and `fault_soak.rs`: the six stacks, formatted by the `sealdisk`
//! binary and opened through `volume` exactly as `sealdisk open` / `sealdisk integrity open`
//! do; a minimal NBD client that reports errors instead of panicking (the soak kills its
//! server); and per-file `fdatasync` fault arming through `blockdev::fault_hook`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use blockdev::BlockDevice;
use formats::integrity::Mode;
use sector_crypto::kdf::Passphrase;

pub const PASS: &[u8] = b"durability soak";
/// Plain dm-crypt key (aes-xts-plain64, 512 bits), hex.
const PLAIN_KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\
                         0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// The stacks of the soak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stack {
    Plain,
    Luks2,
    IntegrityJ,
    IntegrityB,
    IntegrityD,
    Luks2Aead,
}

impl Stack {
    pub const ALL: [Stack; 6] = [
        Stack::Plain,
        Stack::Luks2,
        Stack::IntegrityJ,
        Stack::IntegrityB,
        Stack::IntegrityD,
        Stack::Luks2Aead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stack::Plain => "plain",
            Stack::Luks2 => "luks2",
            Stack::IntegrityJ => "integrity-J",
            Stack::IntegrityB => "integrity-B",
            Stack::IntegrityD => "integrity-D",
            Stack::Luks2Aead => "luks2-aead",
        }
    }

    pub fn parse(s: &str) -> Option<Stack> {
        Stack::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Whether a block can fail its integrity check after a crash (a torn data/tag pair).
    pub fn integrity(self) -> bool {
        matches!(self, Stack::IntegrityJ | Stack::IntegrityB | Stack::IntegrityD | Stack::Luks2Aead)
    }

    /// Image size: LUKS2 puts its data at 16 MiB.
    pub fn image_size(self) -> u64 {
        match self {
            Stack::Luks2 | Stack::Luks2Aead => 20 << 20,
            _ => 6 << 20,
        }
    }
}

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sealdisk"))
}

/// Creates a sparse `img` and formats it as `stack` with the `sealdisk` binary. With
/// `no_wipe` the integrity stacks' data and tag areas stay holes (blocks never written fail
/// their check, as in the kernel) so a small filesystem fills up as the volume is written.
pub fn format(stack: Stack, img: &Path, no_wipe: bool) {
    let f = std::fs::File::create(img).unwrap();
    f.set_len(stack.image_size()).unwrap();
    drop(f);
    let pass = img.with_extension("pass");
    std::fs::write(&pass, PASS).unwrap();
    let (img_s, pass_s) = (img.to_str().unwrap(), pass.to_str().unwrap());
    let luks =
        ["luksFormat", "-q", "--type", "luks2", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
    let mut args: Vec<&str> = match stack {
        Stack::Plain => return,
        Stack::Luks2 => luks.to_vec(),
        Stack::Luks2Aead => [&luks[..], &["--integrity", "hmac-sha256"]].concat(),
        Stack::IntegrityJ | Stack::IntegrityB | Stack::IntegrityD => {
            vec!["integrity", "format", "-q", "--no-progress"]
        }
    };
    args.extend(["--sector-size", "4096"]);
    if no_wipe {
        args.push(if stack == Stack::Luks2Aead { "--integrity-no-wipe" } else { "--no-wipe" });
        if stack == Stack::Luks2 {
            args.pop();
        }
    }
    if matches!(stack, Stack::Luks2 | Stack::Luks2Aead) {
        args.extend(["--key-file", pass_s]);
    }
    args.push(img_s);
    let out = Command::new(bin()).args(&args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Opens `img` as `stack` the way the CLI does.
pub fn open(stack: Stack, img: &Path) -> Result<Arc<dyn BlockDevice>, String> {
    let path = img.to_str().unwrap();
    let integrity = |mode| {
        let p = volume::integrity::IntegrityParams { mode, ..Default::default() };
        volume::integrity::open(path, &p).map(|t| t as Arc<dyn BlockDevice>).map_err(|e| format!("{e:#}"))
    };
    match stack {
        Stack::Plain => {
            let sectors = stack.image_size() / 512;
            let line = format!("0 {sectors} crypt aes-xts-plain64 {PLAIN_KEY} 0 {path} 0 1 sector_size:4096");
            let table = formats::dm::CryptTable::parse(&line).map_err(|e| e.to_string())?;
            volume::open_crypt_table(&table, &volume::OpenOptions::default())
                .map(|v| v.device)
                .map_err(|e| format!("{e:#}"))
        }
        Stack::Luks2 | Stack::Luks2Aead => {
            volume::luks::open(&volume::luks::OpenParams::new(path), &Passphrase::new(PASS.to_vec()))
                .map(|o| o.volume.device)
                .map_err(|e| format!("{e:?}"))
        }
        Stack::IntegrityJ => integrity(Mode::Journal),
        Stack::IntegrityB => integrity(Mode::Bitmap),
        Stack::IntegrityD => integrity(Mode::Direct),
    }
}

/// Per-file fault plans for `blockdev::fault_hook` (one process-wide hook, files told apart).
#[derive(Debug, Default)]
pub struct FilePlan {
    /// The next this-many `fdatasync`s fail with EIO.
    pub fail_syncs: u64,
    /// 1 in N reads / writes / syncs fail with EIO (0: never), drawn from `rng`.
    pub read_one_in: u64,
    pub write_one_in: u64,
    pub sync_one_in: u64,
    pub rng: u64,
    /// Faults injected so far.
    pub injected: u64,
}

fn plans() -> &'static Mutex<HashMap<PathBuf, FilePlan>> {
    static PLANS: OnceLock<Mutex<HashMap<PathBuf, FilePlan>>> = OnceLock::new();
    PLANS.get_or_init(|| {
        blockdev::fault_hook::set(Some(Arc::new(|path: &Path, op, _, _| {
            use blockdev::fault_hook::FileOp;
            let mut plans = plans().lock().unwrap_or_else(|e| e.into_inner());
            let p = plans.get_mut(path)?;
            let one_in = match op {
                FileOp::Read => p.read_one_in,
                FileOp::Write => p.write_one_in,
                FileOp::Sync => p.sync_one_in,
            };
            let mut fail = op == FileOp::Sync && p.fail_syncs > 0;
            if fail {
                p.fail_syncs -= 1;
            } else if one_in > 0 {
                p.rng = testkit::pattern::splitmix64(p.rng);
                fail = p.rng % one_in == 0;
            }
            p.injected += u64::from(fail);
            fail.then(|| io::Error::from_raw_os_error(libc::EIO))
        })));
        Mutex::new(HashMap::new())
    })
}

/// Changes the fault plan of `path`.
pub fn with_plan<R>(path: &Path, f: impl FnOnce(&mut FilePlan) -> R) -> R {
    let mut plans = plans().lock().unwrap_or_else(|e| e.into_inner());
    f(plans.entry(path.to_path_buf()).or_default())
}

// ---- a minimal NBD client (fixed newstyle, NBD_OPT_GO, simple replies, one request at a time)

pub const NBD_READ: u16 = 0;
pub const NBD_WRITE: u16 = 1;
pub const NBD_FLUSH: u16 = 3;
pub const NBD_FLAG_FUA: u16 = 1;
pub const NBD_EIO: u32 = 5;

/// What a request got: `Ok(data)` or the NBD error number; `Err` is a broken connection.
pub type Reply = io::Result<Result<Vec<u8>, u32>>;

pub struct Client {
    s: UnixStream,
    cookie: u64,
    pub size: u64,
}

impl Client {
    pub fn connect(sock: &Path, export: &str) -> io::Result<Client> {
        let mut s = UnixStream::connect(sock)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut g = [0u8; 18];
        s.read_exact(&mut g)?;
        if &g[..16] != b"NBDMAGICIHAVEOPT" {
            return Err(io::Error::other("bad greeting"));
        }
        s.write_all(&3u32.to_be_bytes())?;
        let mut opt = Vec::new();
        opt.extend_from_slice(b"IHAVEOPT");
        opt.extend_from_slice(&7u32.to_be_bytes());
        opt.extend_from_slice(&(4 + export.len() as u32 + 2).to_be_bytes());
        opt.extend_from_slice(&(export.len() as u32).to_be_bytes());
        opt.extend_from_slice(export.as_bytes());
        opt.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&opt)?;
        let mut size = None;
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h)?;
            let typ = u32::from_be_bytes(h[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
            let mut data = vec![0u8; len];
            s.read_exact(&mut data)?;
            match typ {
                1 => break,
                3 if data.len() >= 10 && data[..2] == [0, 0] => {
                    size = Some(u64::from_be_bytes(data[2..10].try_into().unwrap()))
                }
                3 => {}
                t => return Err(io::Error::other(format!("NBD_OPT_GO refused: {t:#x}"))),
            }
        }
        let size = size.ok_or_else(|| io::Error::other("no NBD_INFO_EXPORT"))?;
        Ok(Client { s, cookie: 1, size })
    }

    pub fn request(&mut self, typ: u16, flags: u16, off: u64, len: u32, payload: &[u8]) -> Reply {
        self.cookie += 1;
        let mut r = Vec::with_capacity(28 + payload.len());
        r.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        r.extend_from_slice(&flags.to_be_bytes());
        r.extend_from_slice(&typ.to_be_bytes());
        r.extend_from_slice(&self.cookie.to_be_bytes());
        r.extend_from_slice(&off.to_be_bytes());
        r.extend_from_slice(&len.to_be_bytes());
        r.extend_from_slice(payload);
        self.s.write_all(&r)?;
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h)?;
        if h[..4] != 0x6744_6698u32.to_be_bytes() || h[8..16] != self.cookie.to_be_bytes() {
            return Err(io::Error::other("bad reply header"));
        }
        let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
        if err != 0 {
            return Ok(Err(err));
        }
        let mut data = vec![0u8; if typ == NBD_READ { len as usize } else { 0 }];
        self.s.read_exact(&mut data)?;
        Ok(Ok(data))
    }

    pub fn read(&mut self, off: u64, len: u32) -> Reply {
        self.request(NBD_READ, 0, off, len, &[])
    }

    pub fn write(&mut self, off: u64, data: &[u8], fua: bool) -> Reply {
        self.request(NBD_WRITE, if fua { NBD_FLAG_FUA } else { 0 }, off, data.len() as u32, data)
    }

    pub fn flush(&mut self) -> Reply {
        self.request(NBD_FLUSH, 0, 0, 0, &[])
    }
}
