//! Process CPU time from `getrusage(RUSAGE_SELF)`: every thread of this process, including
//! threads that have already exited (crypto pool, NBD client readers).

use std::time::{Duration, Instant};

use nix::sys::resource::{getrusage, UsageWho};

/// A snapshot of the process's resource usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuSnapshot {
    /// When it was taken.
    pub at: Instant,
    /// User time.
    pub user: Duration,
    /// System time.
    pub sys: Duration,
    /// Voluntary plus involuntary context switches.
    pub ctx: u64,
}

impl CpuSnapshot {
    /// Now. All zeroes if the call fails (it cannot for RUSAGE_SELF).
    pub fn now() -> Self {
        match getrusage(UsageWho::RUSAGE_SELF) {
            Ok(u) => {
                let tv = |t: nix::sys::time::TimeVal| {
                    Duration::from_secs(t.tv_sec().max(0) as u64)
                        + Duration::from_micros(t.tv_usec().max(0) as u64)
                };
                CpuSnapshot {
                    at: Instant::now(),
                    user: tv(u.user_time()),
                    sys: tv(u.system_time()),
                    ctx: (u.voluntary_context_switches().max(0) + u.involuntary_context_switches().max(0))
                        as u64,
                }
            }
            Err(_) => CpuSnapshot { at: Instant::now(), user: Duration::ZERO, sys: Duration::ZERO, ctx: 0 },
        }
    }

    /// `(user %, sys %, context switches)` from `earlier` to `self`, over the wall time
    /// between them; 100% is one core, as fio's `usr=`/`sys=`.
    pub fn usage_since(&self, earlier: &CpuSnapshot) -> (f64, f64, u64) {
        let wall = self.at.saturating_duration_since(earlier.at).as_secs_f64().max(1e-6);
        let pct = |a: Duration, b: Duration| a.saturating_sub(b).as_secs_f64() / wall * 100.0;
        (pct(self.user, earlier.user), pct(self.sys, earlier.sys), self.ctx.saturating_sub(earlier.ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_only_moves_forward() {
        let a = CpuSnapshot::now();
        let mut x = 0u64;
        for i in 0..200_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let b = CpuSnapshot::now();
        assert!(b.user + b.sys >= a.user + a.sys);
        let (u, s, _) = b.usage_since(&a);
        assert!(u >= 0.0 && s >= 0.0);
    }
}
