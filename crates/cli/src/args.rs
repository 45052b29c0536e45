//! Argument groups shared by several actions, each turned into the library's types in one
//! place (actions depend on this module, never on each other for their arguments).
use clap::Args;
use formats::dm::CryptOptions;

/// dm-crypt's performance flags (`--perf-*`), as `open`, `refresh` and the tcrypt, LUKS and
/// plain branches of `open` take them.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct PerfArgs {
    /// Keep each request's crypto on one pool thread.
    #[arg(long = "perf-same_cpu_crypt")]
    pub same_cpu_crypt: bool,
    /// With pooled crypto, the pool thread that encrypts a write also submits it.
    #[arg(long = "perf-submit_from_crypt_cpus")]
    pub submit_from_crypt_cpus: bool,
    /// Decrypt on the request's thread, not the crypto pool.
    #[arg(long = "perf-no_read_workqueue")]
    pub no_read_workqueue: bool,
    /// Encrypt on the request's thread, not the crypto pool.
    #[arg(long = "perf-no_write_workqueue")]
    pub no_write_workqueue: bool,
}

impl PerfArgs {
    /// The activation flags these set, with `allow_discards`; everything else default.
    pub fn crypt_options(&self, allow_discards: bool) -> CryptOptions {
        CryptOptions {
            allow_discards,
            same_cpu_crypt: self.same_cpu_crypt,
            submit_from_crypt_cpus: self.submit_from_crypt_cpus,
            no_read_workqueue: self.no_read_workqueue,
            no_write_workqueue: self.no_write_workqueue,
            ..CryptOptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        perf: PerfArgs,
    }

    #[test]
    fn flags_become_the_crypt_options() {
        let a = Cli::try_parse_from(["x", "--perf-no_read_workqueue", "--perf-same_cpu_crypt"]).unwrap().perf;
        let o = a.crypt_options(true);
        assert!(o.allow_discards && o.no_read_workqueue && o.same_cpu_crypt);
        assert!(!o.no_write_workqueue && !o.submit_from_crypt_cpus && !o.high_priority);
        assert_eq!(o.sector_size, None);
    }
}
