//! Every JSON report validates against `schemas/bench-report.schema.json`: a single job, a
//! comparison (with its per-repetition jobs), and `benchmark`'s micro results; and the
//! schema really constrains (a broken report fails).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bench::compare::{run_comparison, CompareEnv, Comparison, Point, Variant};
use bench::report::{Report, ReportJob};
use bench::{run_job, DeviceTarget, JobSpec, RunOptions, RwMode, StackSpec};
use blockdev::MemDevice;
use serde_json::Value;

fn validator() -> jsonschema::Validator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas/bench-report.schema.json");
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    jsonschema::validator_for(&schema).expect("the schema itself is valid")
}

fn assert_valid(v: &jsonschema::Validator, doc: &Value) {
    let errors: Vec<String> = v.iter_errors(doc).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(errors.is_empty(), "report does not match the schema:\n{}", errors.join("\n"));
}

#[test]
fn single_job_report_validates() {
    let t = DeviceTarget::new(Arc::new(MemDevice::new(1 << 20, 512)), "mem");
    let mut spec = JobSpec::new("j", RwMode::RandRw, 4096);
    spec.verify = true;
    let r = run_job(&t, &spec, &RunOptions::default()).unwrap();
    let mut rep = Report::new("sealdisk bench --rw=randrw".into());
    rep.jobs.push(ReportJob { variant: None, repetition: None, result: r });
    let doc: Value = serde_json::from_str(&rep.to_json()).unwrap();
    assert_valid(&validator(), &doc);
    assert_eq!(doc["jobs"][0]["options"]["rw"], "randrw");
    assert!(doc["jobs"][0]["read"]["clat_ns"]["percentile"]["99.990000"].is_u64());
}

#[test]
fn comparison_report_validates_and_a_broken_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let job = JobSpec::new("rr", RwMode::RandRead, 4096);
    let mut w = JobSpec::new("w", RwMode::Write, 4096);
    w.size = Some(256 << 10);
    let c = Comparison {
        title: "t".into(),
        knob: "crypt-mode".into(),
        seed: None,
        note: None,
        variants: vec![
            Variant::new("raw", StackSpec::raw()),
            Variant::parse("inline:crypt-mode=inline,sector-size=512", &StackSpec::default()).unwrap(),
        ],
        points: vec![
            Point::one("4k", job),
            Point { label: "dd".into(), jobs: vec![w, JobSpec::new("r", RwMode::Read, 4096)] },
        ],
        repetitions: 2,
        volume_size: 1 << 20,
    };
    let env = CompareEnv { dir: dir.path().into(), run: RunOptions::default(), chatty: false };
    let mut rep = Report::new("sealdisk bench --compare".into());
    let res = run_comparison(&c, &env, &mut |j| rep.jobs.push(j)).unwrap();
    assert_eq!(rep.jobs.len(), 2 * 2 * 3);
    let table = bench::compare::table(&res);
    assert!(table.contains("inline") && table.contains("READ") && table.contains("WRITE"), "{table}");
    let svg = bench::svg::chart(&res);
    assert!(svg.contains("<svg"));
    rep.comparisons.push(res);
    let v = validator();
    let mut doc: Value = serde_json::from_str(&rep.to_json()).unwrap();
    assert_valid(&v, &doc);
    let cell = &doc["comparisons"][0]["points"][1]["cells"][1];
    assert!(cell["read"]["change_pct"].is_number() && cell["write"]["change_pct"].is_number());
    assert_eq!(cell["read"]["bw_bytes"]["samples"].as_array().unwrap().len(), 2);

    doc["jobs"][0]["read"]["iops"] = Value::from("fast");
    assert!(!v.is_valid(&doc));
    doc["jobs"][0].as_object_mut().unwrap().remove("read");
    assert!(!v.is_valid(&doc));
}

#[test]
fn micro_report_validates() {
    let mut rep = Report::new("sealdisk benchmark".into());
    rep.micro = Some(bench::micro::run(Duration::from_millis(2)).unwrap());
    let doc: Value = serde_json::from_str(&rep.to_json()).unwrap();
    assert_valid(&validator(), &doc);
}
