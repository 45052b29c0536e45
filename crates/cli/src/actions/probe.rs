//! `sealdisk probe DEVICE [--json]`: what a device holds, as blkid says it (exit 0 when a
//! format was recognised, 2 when nothing was), with what the header tells in plaintext.
//! No key is asked for. The probe itself is `volume::describe`.

use anyhow::{Context, Result};
use clap::Args;

use super::Quiet;

/// blkid's exit code when nothing was recognised.
pub const NOTHING_FOUND: u8 = 2;

/// Arguments of `sealdisk probe`.
#[derive(Debug, Args)]
#[command(after_help = "\
Prints DEVICE: TYPE=\"...\" and what the header says (VERSION, UUID, LABEL, SIZE, CIPHER,
AUTHENTICATED; TAG_SIZE, FLAGS and, while bitmap mode is active, MODE for dm-integrity). TYPE is the value `open --type` takes.
Exit status: 0 a format was recognised, 2 nothing was (plain dm-crypt, TrueCrypt and
VeraCrypt have no signature: they look like this), 4 the device cannot be opened.")]
pub struct ProbeArgs {
    /// Print one JSON object instead.
    #[arg(long)]
    pub json: bool,
    /// The device or image.
    pub device: String,
}

/// Runs `sealdisk probe`.
pub fn run(a: ProbeArgs) -> Result<()> {
    let storage = super::luks::open_meta(&a.device, true)?;
    let d = volume::describe(&storage).with_context(|| format!("probing {}", a.device))?;
    let type_name = d.format.type_name();
    let mut fields: Vec<(&str, String)> = Vec::new();
    if let Some(t) = type_name {
        fields.push(("TYPE", t.to_owned()));
    }
    let mut push = |k: &'static str, v: Option<String>| {
        if let Some(v) = v {
            fields.push((k, v));
        }
    };
    push("VERSION", d.version.clone());
    push("UUID", d.uuid.clone());
    push("LABEL", d.label.clone());
    push("SIZE", Some(d.size.to_string()));
    push("CIPHER", d.cipher.clone());
    push("AUTHENTICATED", d.authenticated.map(|a| if a { "yes" } else { "no" }.to_owned()));
    push("TAG_SIZE", d.tag_size.map(|t| t.to_string()));
    push("MODE", d.integrity_mode.map(str::to_owned));
    push("FLAGS", (!d.integrity_flags.is_empty()).then(|| d.integrity_flags.join(" ")));
    if a.json {
        let mut o = serde_json::Map::new();
        o.insert("device".into(), a.device.clone().into());
        o.insert("format".into(), d.format.name().into());
        o.insert("type".into(), type_name.map_or(serde_json::Value::Null, Into::into));
        o.insert("version".into(), d.version.clone().into());
        o.insert("uuid".into(), d.uuid.clone().into());
        o.insert("label".into(), d.label.clone().into());
        o.insert("size".into(), d.size.into());
        o.insert("cipher".into(), d.cipher.clone().into());
        o.insert("authenticated".into(), d.authenticated.into());
        o.insert("tag_size".into(), d.tag_size.into());
        o.insert("integrity_mode".into(), d.integrity_mode.into());
        o.insert("integrity_flags".into(), d.integrity_flags.clone().into());
        println!("{}", serde_json::Value::Object(o));
    } else if type_name.is_some() {
        let kv: Vec<String> = fields.iter().map(|(k, v)| format!("{k}=\"{}\"", v.escape_default())).collect();
        println!("{}: {}", a.device, kv.join(" "));
    }
    if type_name.is_none() {
        log::info!("{}: no known format (size {} bytes).", a.device, d.size);
        return Err(Quiet(NOTHING_FOUND).into());
    }
    Ok(())
}
