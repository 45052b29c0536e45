//! `sealdisk benchmark`: in-memory cipher, tag-hash and KDF throughput, like
//! `cryptsetup benchmark`: the PBKDF line, then cryptsetup's cipher table (aes, serpent and
//! twofish in cbc and xts) followed by every other cipher sealdisk has; `--cipher` and
//! `--key-size` measure one.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

/// Arguments of `sealdisk benchmark`.
#[derive(Debug, Args)]
pub struct BenchmarkArgs {
    /// CPU time per measurement, in ms (each is the best of three).
    #[arg(long, default_value_t = 100)]
    pub time_per_test: u64,
    /// normal (cryptsetup's layout) or json (schemas/bench-report.schema.json, `micro`).
    #[arg(long = "output-format", default_value = "normal", value_parser = ["normal", "json"])]
    pub output_format: String,
    /// Measure only this cipher: `cipher-mode` as cryptsetup's (`serpent-xts`, measured with
    /// the plain64 IV) or a whole dm-crypt spec (`aes-cbc-essiv:sha256`).
    #[arg(short = 'c', long)]
    pub cipher: Option<String>,
    /// Key size in bits for `--cipher` (default: the spec's cryptsetup default, e.g. 512 for xts).
    #[arg(short = 's', long)]
    pub key_size: Option<u32>,
    /// Encryption sector size in bytes: 512 (cryptsetup's), 1024, 2048 or 4096.
    #[arg(long, default_value_t = 512, value_parser = parse_sector_size)]
    pub sector_size: u32,
}

fn parse_sector_size(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n @ (512 | 1024 | 2048 | 4096)) => Ok(n),
        _ => Err(format!("{s} is not one of 512, 1024, 2048, 4096")),
    }
}

/// Runs `sealdisk benchmark`.
pub fn run(a: BenchmarkArgs) -> Result<()> {
    let ciphers = match (&a.cipher, a.key_size) {
        (None, None) => bench::micro::default_ciphers(),
        (None, Some(_)) => bail!("--key-size needs --cipher"),
        (Some(name), bits) => {
            let spec: sector_crypto::CipherSpec = bench::micro::bench_spec(name)
                .parse()
                .with_context(|| format!("Cipher {name} is not available."))?;
            let bits = bits.unwrap_or(spec.default_key_bits() as u32);
            if !volume::luks::key_bytes(bits as usize).is_ok_and(|b| spec.valid_key_sizes().contains(&b)) {
                bail!(
                    "Cipher {name} (with {bits} bits key) is not available: key sizes are {}.",
                    spec.key_sizes_text()
                );
            }
            vec![(name.clone(), bits)]
        }
    };
    let per_test = Duration::from_millis(a.time_per_test.clamp(1, 10_000));
    let r = bench::micro::run_selected(per_test, &ciphers, a.sector_size)?;
    if a.output_format == "json" {
        let mut rep = bench::report::Report::new(std::env::args().collect::<Vec<_>>().join(" "));
        rep.micro = Some(r);
        println!("{}", rep.to_json());
    } else {
        print!("{}", bench::micro::text(&r));
    }
    Ok(())
}
