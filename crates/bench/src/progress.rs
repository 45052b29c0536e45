//! The progress line on stderr: share done, live IOPS, average bandwidth, time left.
//! Hidden when stderr is not a terminal or when the caller turns it off.

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::engine::LiveCounters;
use crate::report::{fmt_bw, fmt_count};
use crate::spec::JobSpec;

/// A progress line for one job.
#[derive(Debug)]
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    time_based: Option<Duration>,
}

impl Progress {
    /// A progress line, or nothing when `on` is false or stderr is not a terminal.
    pub(crate) fn new(on: bool, label: &str, spec: &JobSpec, total_ops: Option<u64>) -> Self {
        let time_based = if spec.time_based || total_ops.is_none() {
            spec.runtime.map(|r| r + spec.ramp_time)
        } else {
            None
        };
        if !on || !std::io::stderr().is_terminal() {
            return Progress { bar: None, time_based };
        }
        let len = match time_based {
            Some(d) => d.as_millis() as u64,
            None => total_ops.unwrap_or(0),
        };
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr_with_hz(5));
        let style = ProgressStyle::with_template("{prefix:.bold} [{bar:20}] {percent:>3}% {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        let prefix = if label.is_empty() { spec.name.clone() } else { format!("{label} {}", spec.name) };
        bar.set_prefix(prefix);
        Progress { bar: Some(bar), time_based }
    }

    /// Updates the line; `last` is `(ios, elapsed_ns)` at the previous tick.
    pub(crate) fn tick(&self, live: &LiveCounters, elapsed_ns: u64, last: (u64, u64)) -> (u64, u64) {
        let ios = live.read_ios.load(Ordering::Relaxed) + live.write_ios.load(Ordering::Relaxed);
        let Some(bar) = &self.bar else { return (ios, elapsed_ns) };
        let dt = elapsed_ns.saturating_sub(last.1) as f64 / 1e9;
        if dt > 0.0 {
            let iops = (ios - last.0.min(ios)) as f64 / dt;
            let bytes = live.bytes.load(Ordering::Relaxed) as f64;
            let secs = (elapsed_ns as f64 / 1e9).max(1e-9);
            let left = match (self.time_based, bar.length()) {
                (Some(total), _) => (total.as_secs_f64() - secs).max(0.0),
                (None, Some(n)) if ios > 0 => secs * n.saturating_sub(ios) as f64 / ios as f64,
                _ => 0.0,
            };
            bar.set_message(format!("{} IOPS {} | {left:.1}s left", fmt_count(iops), fmt_bw(bytes / secs)));
        }
        match self.time_based {
            Some(_) => bar.set_position(elapsed_ns / 1_000_000),
            None => bar.set_position(ios),
        }
        (ios, elapsed_ns)
    }

    /// Removes the line.
    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
