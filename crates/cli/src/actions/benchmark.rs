//! `sealdisk benchmark`: in-memory cipher, tag-hash and KDF throughput, like
//! `cryptsetup benchmark`.

use std::time::Duration;

use anyhow::Result;
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
}

/// Runs `sealdisk benchmark`.
pub fn run(a: BenchmarkArgs) -> Result<()> {
    let r = bench::micro::run(Duration::from_millis(a.time_per_test.clamp(1, 10_000)))?;
    if a.output_format == "json" {
        let mut rep = bench::report::Report::new(std::env::args().collect::<Vec<_>>().join(" "));
        rep.micro = Some(r);
        println!("{}", rep.to_json());
    } else {
        print!("{}", bench::micro::text(&r));
    }
    Ok(())
}
