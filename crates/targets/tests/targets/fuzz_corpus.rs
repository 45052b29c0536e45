//! The `integrity_open` fuzz target's committed inputs, replayed on stable in the ordinary
//! test run through the same function (`targets::fuzzing::integrity_open`): every file of
//! `fuzz/seeds/integrity_open/` (kernel images cut after the journal, made by
//! `fuzz/make-seeds.sh`) and `fuzz/corpus/integrity_open/` (minimised corpus and the inputs of
//! past findings). The seeds must open, so that the fuzzer starts past the checks.

use std::path::{Path, PathBuf};

fn files(kind: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz").join(kind).join("integrity_open");
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    out.sort();
    out.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
}

#[test]
fn integrity_open_seeds_open() {
    let seeds = files("seeds");
    assert!(seeds.len() >= 2);
    for (p, b) in seeds {
        assert!(targets::fuzzing::integrity_open(&b), "{} does not open", p.display());
    }
}

#[test]
fn integrity_open_corpus_replays() {
    for (_, b) in files("corpus") {
        targets::fuzzing::integrity_open(&b);
    }
}
