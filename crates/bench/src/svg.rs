//! A hand-written SVG bar chart of a comparison: one panel per direction (READ, WRITE
//! bandwidth), one group of bars per point, one bar per variant, min–max whiskers.

use std::fmt::Write as _;

use crate::compare::{CellDir, ComparisonResult};

const COLORS: [&str; 8] =
    ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A "nice" axis maximum ≥ `v`: 1, 2, 2.5 or 5 × 10^k.
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let e = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * e >= v {
            return m * e;
        }
    }
    10.0 * e
}

/// Tick intervals for an axis up to `max` (a `nice_max`): steps of 1, 2, 2.5 or 5 × 10^k.
fn ticks_for(max: f64) -> u32 {
    let m = max / 10f64.powf(max.log10().floor());
    if (m - 2.0).abs() < 1e-9 {
        4
    } else {
        5
    }
}

/// `1234`, `56.7`, `3.21`.
fn short(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The chart as an SVG document.
pub fn chart(r: &ComparisonResult) -> String {
    let nv = r.variants.len().max(1);
    let np = r.points.len().max(1);
    let bar = 22.0;
    let group = nv as f64 * bar + 24.0;
    let left = 70.0;
    let text_w = r.title.len().max(r.knob.len()) as f64 * 7.0;
    let plot_w = (np as f64 * group).max(360.0).max(text_w - 20.0);
    let width = left + plot_w + 20.0;
    let panel_h = 220.0;
    let top = 70.0 + 18.0 * ((nv as f64) / 3.0).ceil();
    type Pick = fn(&crate::compare::Cell) -> Option<&CellDir>;
    let dirs: Vec<(&str, Pick)> = vec![("READ", |c| c.read.as_ref()), ("WRITE", |c| c.write.as_ref())];
    let dirs: Vec<_> = dirs
        .into_iter()
        .filter(|(_, f)| r.points.iter().any(|p| p.cells.iter().any(|c| f(c).is_some())))
        .collect();
    let height = top + dirs.len().max(1) as f64 * (panel_h + 60.0) + 10.0;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ =
        writeln!(s, r#"<text x="{left}" y="22" font-size="15" font-weight="bold">{}</text>"#, esc(&r.title));
    let _ = writeln!(s, r##"<text x="{left}" y="40" fill="#555">{}</text>"##, esc(&r.knob));
    for (i, v) in r.variants.iter().enumerate() {
        let x = left + (i % 3) as f64 * 200.0;
        let y = 58.0 + (i / 3) as f64 * 18.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            y - 10.0,
            COLORS[i % COLORS.len()],
            x + 16.0,
            y,
            esc(&v.name)
        );
    }
    for (di, (name, get)) in dirs.iter().enumerate() {
        let y0 = top + di as f64 * (panel_h + 60.0);
        let base = y0 + panel_h;
        let max = r
            .points
            .iter()
            .flat_map(|p| p.cells.iter().filter_map(|c| get(c).map(|d| d.bw_bytes.max)))
            .fold(0.0, f64::max)
            / 1048576.0;
        let ymax = nice_max(max);
        let _ = writeln!(
            s,
            r#"<text x="{left}" y="{}" font-weight="bold">{name} bandwidth (MiB/s)</text>"#,
            y0 - 6.0
        );
        let ticks = ticks_for(ymax);
        for t in 0..=ticks {
            let v = ymax * t as f64 / ticks as f64;
            let y = base - panel_h * t as f64 / ticks as f64;
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                left + plot_w,
                left - 6.0,
                y + 4.0,
                if ymax >= 10.0 { format!("{v:.0}") } else { format!("{v:.2}") }
            );
        }
        for (pi, p) in r.points.iter().enumerate() {
            // Groups spread over the plot, bars centred in their slot.
            let slot = plot_w / np as f64;
            let gx = left + pi as f64 * slot + (slot - nv as f64 * bar) / 2.0;
            for (vi, c) in p.cells.iter().enumerate() {
                let Some(d) = get(c) else { continue };
                let h = |b: f64| (b / 1048576.0 / ymax * panel_h).min(panel_h);
                let x = gx + vi as f64 * bar;
                let bh = h(d.bw_bytes.median);
                let _ = writeln!(
                    s,
                    r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{}"><title>{} {}: {:.1} MiB/s (min {:.1}, max {:.1})</title></rect>"#,
                    base - bh,
                    bar - 3.0,
                    COLORS[vi % COLORS.len()],
                    esc(&c.variant),
                    esc(&p.label),
                    d.bw_bytes.median / 1048576.0,
                    d.bw_bytes.min / 1048576.0,
                    d.bw_bytes.max / 1048576.0
                );
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="9">{}</text>"#,
                    x + (bar - 3.0) / 2.0,
                    base - h(d.bw_bytes.max).max(bh) - 4.0,
                    short(d.bw_bytes.median / 1048576.0)
                );
                if d.bw_bytes.max > d.bw_bytes.min {
                    let cx = x + (bar - 3.0) / 2.0;
                    let _ = writeln!(
                        s,
                        r#"<line x1="{cx:.1}" y1="{:.1}" x2="{cx:.1}" y2="{:.1}" stroke="black"/>"#,
                        base - h(d.bw_bytes.min),
                        base - h(d.bw_bytes.max)
                    );
                }
            }
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                gx + nv as f64 * bar / 2.0,
                base + 16.0,
                esc(&p.label)
            );
        }
        let _ = writeln!(
            s,
            r#"<line x1="{left}" y1="{base}" x2="{:.1}" y2="{base}" stroke="black"/>"#,
            left + plot_w
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::{Cell, PointResult, Spread, VariantInfo};

    #[test]
    fn chart_has_a_bar_per_cell_and_escapes_text() {
        let d = |mib: f64| CellDir {
            bw_bytes: Spread::of(&[mib * 1048576.0, mib * 1.1 * 1048576.0]),
            iops: Spread::of(&[1.0]),
            lat_mean_ns: Spread::of(&[1.0]),
            change_pct: None,
        };
        let r = ComparisonResult {
            title: "a <b>".into(),
            knob: "k & k".into(),
            seed: None,
            note: None,
            repetitions: 2,
            variants: vec![
                VariantInfo { name: "pool".into(), stack: "s".into(), job_overrides: vec![] },
                VariantInfo { name: "inline".into(), stack: "s".into(), job_overrides: vec![] },
            ],
            points: vec![PointResult {
                label: "4k".into(),
                jobs: vec![],
                cells: vec![
                    Cell { variant: "pool".into(), read: Some(d(10.0)), write: None },
                    Cell { variant: "inline".into(), read: Some(d(13.0)), write: None },
                ],
            }],
        };
        let svg = chart(&r);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<rect x=").count(), 2 + 2, "2 legend swatches + 2 bars");
        assert_eq!((ticks_for(250.0), ticks_for(200.0), ticks_for(1.0)), (5, 4, 5));
        assert!(svg.contains("a &lt;b&gt;") && svg.contains("k &amp; k"));
        assert!(svg.contains("READ bandwidth") && !svg.contains("WRITE bandwidth"));
        assert_eq!(nice_max(13.2), 20.0);
        assert_eq!(nice_max(0.0), 1.0);
    }
}
