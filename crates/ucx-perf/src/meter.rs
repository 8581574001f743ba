//! Timing of a test run, as `ucx_perftest` computes it.
//!
//! One cycle-counter read per iteration feeds a ring of the last [`TIMING_QUEUE`] iteration
//! times (for the percentile) and the running totals. Latency is time per iteration, halved for
//! ping-pong tests (one way); "average" figures cover the interval since the previous report,
//! "overall" figures the whole measured run. Bandwidth is bytes per second in MiB and message
//! rate messages per second, both doubled for ping-pong (both directions carry a message per
//! iteration), as the reference computes them. The percentile is element
//! `floor((n - 1) * R / 100)` of the sorted window.

/// Iterations kept for the percentile.
pub const TIMING_QUEUE: usize = 2048;
const _: () = assert!(TIMING_QUEUE.is_power_of_two(), "the ring's index is masked");

/// Figures of one report.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measured {
    /// Iterations so far.
    pub iters: u64,
    /// Percentile latency over the last iterations, microseconds.
    pub lat_percentile_us: f64,
    /// Average latency since the previous report, microseconds.
    pub lat_avg_us: f64,
    /// Average latency since the start, microseconds.
    pub lat_overall_us: f64,
    /// Bandwidth since the previous report, MiB/s.
    pub bw_avg_mbs: f64,
    /// Bandwidth since the start, MiB/s.
    pub bw_overall_mbs: f64,
    /// Message rate since the previous report, per second.
    pub msgrate_avg: f64,
    /// Message rate since the start, per second.
    pub msgrate_overall: f64,
    /// Seconds since the start.
    pub elapsed_s: f64,
}

/// Counts iterations and time.
pub struct Meter {
    rate: f64,
    factor: f64,
    percentile: f64,
    max_iters: u64,
    report_every: u64,
    start: u64,
    now: u64,
    iters: u64,
    bytes: u64,
    msgs: u64,
    rep_time: u64,
    rep_iters: u64,
    rep_bytes: u64,
    rep_msgs: u64,
    /// The "average" figures (latency, bandwidth, message rate) of the last interval that
    /// counted iterations, for a measurement whose own interval is empty.
    last_avg: Option<(f64, f64, f64)>,
    /// The last iterations' durations (a ring; `msgs` says how much of it is filled).
    queue: Box<[u64; TIMING_QUEUE]>,
    qhead: usize,
}

impl Meter {
    /// A meter for `max_iters` iterations; `pingpong` halves latencies; reports every second.
    pub fn new(max_iters: u64, percentile: f64, pingpong: bool) -> Self {
        let rate = ucs::time::cycles_per_sec();
        Meter {
            rate,
            factor: if pingpong { 2.0 } else { 1.0 },
            percentile,
            max_iters,
            report_every: rate as u64,
            start: 0,
            now: 0,
            iters: 0,
            bytes: 0,
            msgs: 0,
            rep_time: 0,
            rep_iters: 0,
            rep_bytes: 0,
            rep_msgs: 0,
            last_avg: None,
            queue: Box::new([0u64; TIMING_QUEUE]),
            qhead: 0,
        }
    }

    /// Starts the clock.
    pub fn start(&mut self) {
        self.start = ucs::time::cycles();
        self.now = self.start;
        self.rep_time = self.start;
    }

    /// True once `max_iters` iterations are counted.
    #[inline]
    pub fn done(&self) -> bool {
        self.iters >= self.max_iters
    }

    /// Iterations counted.
    #[inline]
    pub fn iters(&self) -> u64 {
        self.iters
    }

    /// Adds `iters` iterations carrying `bytes`; true when a progress report is due.
    #[inline]
    pub fn update(&mut self, iters: u64, bytes: u64) -> bool {
        let t = ucs::time::cycles();
        // As the reference's `ucx_perf_update`: one store into the ring, no bounds check (the
        // index is masked), its fill level derived from `msgs` when measured.
        self.queue[self.qhead % TIMING_QUEUE] = t.wrapping_sub(self.now);
        self.qhead = (self.qhead + 1) % TIMING_QUEUE;
        self.now = t;
        self.iters += iters;
        self.bytes += bytes;
        self.msgs += 1;
        t.wrapping_sub(self.rep_time) >= self.report_every
    }

    /// Sets the iteration count directly (receivers that count by sequence numbers).
    #[inline]
    pub fn set_iters(&mut self, iters: u64, bytes_per_iter: u64) {
        if iters != self.iters {
            let d = iters - self.iters;
            self.update(d, d * bytes_per_iter);
        }
    }

    /// Stops the clock at the current time.
    pub fn stop(&mut self) {
        self.now = ucs::time::cycles();
    }

    /// The figures now; `reset_interval` starts a new "average" interval.
    pub fn measure(&mut self, reset_interval: bool) -> Measured {
        let secs = |c: u64| c as f64 / self.rate;
        let total_t = secs(self.now.wrapping_sub(self.start)).max(1e-12);
        let int_t = secs(self.now.wrapping_sub(self.rep_time)).max(1e-12);
        let int_iters = (self.iters - self.rep_iters).max(1) as f64;
        let mib = 1024.0 * 1024.0;
        let filled = (self.msgs as usize).min(TIMING_QUEUE);
        let mut window: Vec<u64> = self.queue[..filled].to_vec();
        window.sort_unstable();
        let pct = if window.is_empty() {
            0.0
        } else {
            let i = ((window.len() - 1) as f64 * self.percentile / 100.0) as usize;
            secs(window[i.min(window.len() - 1)])
        };
        // An interval without iterations (a report came on the last one, and the final
        // figures follow at once) repeats the last interval that had some.
        let empty = self.iters == self.rep_iters;
        let (lat_avg_us, bw_avg_mbs, msgrate_avg) = match self.last_avg {
            Some(last) if empty => last,
            _ => (
                int_t / int_iters * 1e6 / self.factor,
                (self.bytes - self.rep_bytes) as f64 / int_t / mib * self.factor,
                (self.msgs - self.rep_msgs) as f64 / int_t * self.factor,
            ),
        };
        let m = Measured {
            iters: self.iters,
            lat_percentile_us: pct * 1e6 / self.factor,
            lat_avg_us,
            lat_overall_us: total_t / (self.iters.max(1) as f64) * 1e6 / self.factor,
            bw_avg_mbs,
            bw_overall_mbs: self.bytes as f64 / total_t / mib * self.factor,
            msgrate_avg,
            msgrate_overall: self.msgs as f64 / total_t * self.factor,
            elapsed_s: total_t,
        };
        if reset_interval && !empty {
            self.last_avg = Some((lat_avg_us, bw_avg_mbs, msgrate_avg));
        }
        if reset_interval {
            self.rep_time = self.now;
            self.rep_iters = self.iters;
            self.rep_bytes = self.bytes;
            self.rep_msgs = self.msgs;
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts `iters` iterations of `bytes` each, `us` microseconds apart.
    fn run(m: &mut Meter, iters: u64, us: u128, bytes: u64) {
        m.start();
        for _ in 0..iters {
            let t = std::time::Instant::now();
            while t.elapsed().as_micros() < us {}
            m.update(1, bytes);
        }
    }

    #[test]
    fn an_empty_last_interval_repeats_the_one_before() {
        let mut m = Meter::new(4, 50.0, false);
        run(&mut m, 4, 100, 1000);
        // A progress report on the last iteration, then the final figures at once.
        let reported = m.measure(true);
        m.stop();
        let last = m.measure(true);
        assert!(last.bw_avg_mbs > 0.0 && last.msgrate_avg > 0.0, "{last:?}");
        assert_eq!(
            (last.lat_avg_us, last.bw_avg_mbs, last.msgrate_avg),
            (reported.lat_avg_us, reported.bw_avg_mbs, reported.msgrate_avg)
        );
    }

    #[test]
    fn counts_and_rates() {
        let mut m = Meter::new(10, 50.0, true);
        run(&mut m, 10, 200, 8);
        assert!(m.done());
        let r = m.measure(true);
        assert_eq!(r.iters, 10);
        // 200 us per iteration, ping-pong: about 100 us one way.
        assert!(r.lat_overall_us > 90.0 && r.lat_overall_us < 1000.0, "{r:?}");
        assert!(r.lat_percentile_us > 90.0 && r.lat_percentile_us < 1000.0, "{r:?}");
        // Ping-pong: message rate x one-way latency = 1, as in the reference.
        assert!((r.msgrate_overall * r.lat_overall_us * 1e-6 - 1.0).abs() < 0.05, "{r:?}");
        assert!((r.bw_overall_mbs * 1024.0 * 1024.0 / r.msgrate_overall - 8.0).abs() < 0.01);
    }
}
