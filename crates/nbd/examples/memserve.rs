//! Serves an in-memory disk, for trying clients and measuring:
//! `cargo run --release -p nbd --example memserve -- unix:/tmp/mem.sock 1G [threads]`
//! (the export is named "mem"; Ctrl-C stops it).

use std::sync::Arc;

use blockdev::MemDevice;
use nbd::{Export, ListenAddr, Server, ServerConfig};

fn parse_size(s: &str) -> u64 {
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().expect("size") * mult
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let addr: ListenAddr = args.get(1).map_or("unix:/tmp/mem.sock", |s| s.as_str()).parse()?;
    let size = args.get(2).map_or(1 << 30, |s| parse_size(s));
    let mut config = ServerConfig::default();
    if let Some(t) = args.get(3) {
        config.threads_per_connection = t.parse()?;
    }
    let dev = Arc::new(MemDevice::new(size, 512));
    let bound = Server::new(vec![Export::new("mem", dev)], config).bind(&addr)?;
    eprintln!("serving {}", bound.local_addr().uri("mem"));
    bound.serve()?;
    Ok(())
}
