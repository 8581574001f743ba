//! What `ucx-perf` prints, byte for byte as `ucx_perftest` 1.13 (the Debian build, which
//! has OpenMP: progress rows start with `[thread 0]`).
//!
//! [`Reporter::header`] prints the box describing the test and the column header,
//! [`Reporter::begin_test`] the separator naming a batch test, [`Reporter::progress`] a row
//! during the run and [`Reporter::final_row`] the last one. Who prints what:
//!
//! | process | box (`API:`, `Test:`, ...) | column header, rows |
//! |---|---|---|
//! | loopback (`-l`) | yes | yes |
//! | server (no host name) | yes, then a closing line | no |
//! | client (host name) | no | yes |
//!
//! `-f` keeps the box and the column header (its first column says `Test` instead of
//! `Stage`), drops the progress rows, and starts the final row with the batch test name
//! right-aligned in 10 columns (blank without batch files) instead of `Final:    `.
//! `-v` prints the box (on the side that prints it) then a CSV header
//! (`<batch file names>,iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr`)
//! and CSV rows (batch test names first; progress rows keep their `[thread 0]` prefix).
//! `-N` groups the digits of the iteration and message-rate columns by thousands with `,`
//! (the reference does that only where the `en_US` locale is installed). `-I` appends two
//! spaces and the extra information (empty for UCT tests) to every non-CSV row.
//!
//! # How the numbers are measured (the rules of `ucx_perftest`'s libperf)
//!
//! The measurement engine fills [`PerfResult`] by these rules:
//!
//! - **Sides.** The server is group index 0, the client index 1; in loopback one process is
//!   index 0 and its own peer. Ping-pong: index 0 sends first and waits for the answer,
//!   index 1 waits then answers. Stream tests: index 1 (the client) sends, index 0 receives
//!   (or serves gets/atomics); in loopback only the sending loop runs. Only the client (or
//!   the loopback process) prints results.
//! - **Warm-up.** Rounds of 1, 2, 4, 8, ... iterations, each a complete run of the test
//!   without reports, followed by a barrier and a reset of every counter and the clock. A new
//!   round starts while the iterations done in earlier rounds are fewer than `-w` (default
//!   10000: rounds 1..8192, 16383 iterations) unless both sides have passed 100 ms since the
//!   warm-up started (each side says whether it is past that deadline and they exchange; they
//!   go on if either is not). `-w 0`: no warm-up. Warm-up iterations are never reported.
//! - **Counting.** After a barrier the clock starts (start time; also the time of the
//!   "previous report" and of the "previous update"). Every iteration calls
//!   `update(iters = 1, bytes = message size)`: ping-pong on both sides right after their own
//!   send, the stream sender right after each send. `update` adds to `iters` and `bytes`,
//!   adds 1 to `msgs` (the number of `update` calls), and stores the time since the previous
//!   `update` in a ring of the last 2048 samples (zeroed at reset).
//!   The loop ends when `iters` reaches `-n` (`-n 0`: never). Then the side flushes its
//!   endpoint and takes the end time, so the final figures include the flush; the stream
//!   sender (index 1) then calls `update(0, 0)` once more (one more `msgs`, one more sample).
//! - **Progress rows.** Inside `update`, when at least 1 s has passed
//!   since the previous report (or the start), the figures are computed with a fresh
//!   current time, a row is printed, and the "previous report" state becomes the current
//!   one (time, `iters`, `bytes`, `msgs`). No row is checked for during warm-up.
//! - **Figures** (`factor` = 2 for ping-pong tests, 1 otherwise; `t` = current time,
//!   `t0` = start, `tp`/`iters_p`/`bytes_p`/`msgs_p` = at the previous report, or the start):
//!   - `lat_percentile_us`: with `n = min(2048, iters)`, the element at index
//!     `floor((n - 1) * R / 100)` of the first `n` ring samples sorted ascending (`R` = `-R`,
//!     default 50), / `factor`; 0 when `n` is 0;
//!   - `lat_avg_us = (t - tp) / (iters - iters_p) / factor`;
//!   - `lat_overall_us = (t - t0) / iters / factor`;
//!   - `bw_avg_mbs = (bytes - bytes_p) / (t - tp) * factor / 2^20` (MB = MiB);
//!   - `bw_overall_mbs = bytes / (t - t0) * factor / 2^20`;
//!   - `msgrate_avg = (msgs - msgs_p) / (t - tp) * factor`;
//!   - `msgrate_overall = msgs / (t - t0) * factor`;
//!
//!   so a ping-pong test reports half the round trip as latency, and its bandwidth and
//!   message rate count both directions. "Average" is since the previous row, "overall" since
//!   the start; the final row's "average" covers the time since the last progress row (the
//!   whole run when there was none). Nothing guards a zero divisor: `inf` and `-nan` are
//!   printed as C's `printf` prints them.
//! - **Final row.** Computed after the end time (see Counting) by the same formulas and
//!   printed by the side that prints results.

use std::io::{self, Write};

use ucx_perf::params::{Api, Command, PerfParams};

/// The figures of one row (see the module documentation for how each is computed).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PerfResult {
    /// Iterations counted so far.
    pub iters: u64,
    /// Bytes counted so far.
    pub bytes: u64,
    /// Seconds since the start of the measured run.
    pub elapsed_s: f64,
    /// Percentile latency over the last 2048 samples, microseconds.
    pub lat_percentile_us: f64,
    /// Average latency since the previous row, microseconds.
    pub lat_avg_us: f64,
    /// Average latency since the start, microseconds.
    pub lat_overall_us: f64,
    /// Bandwidth since the previous row, MiB/s.
    pub bw_avg_mbs: f64,
    /// Bandwidth since the start, MiB/s.
    pub bw_overall_mbs: f64,
    /// Messages per second since the previous row.
    pub msgrate_avg: f64,
    /// Messages per second since the start.
    pub msgrate_overall: f64,
}

const BOX_LINE: &str =
    "+----------------------------------------------------------------------------------------------------------+";
const TABLE_LINE: &str =
    "+--------------+--------------+------------------------------+---------------------+-----------------------+";
const COLUMN_LINE: &str =
    "+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+";

/// Prints the header and the rows of one `ucx-perf` run (all tests of its batch files).
#[derive(Clone, Debug)]
pub struct Reporter {
    print_test: bool,
    print_results: bool,
    final_only: bool,
    csv: bool,
    numeric: bool,
    extra: bool,
    /// The command line's parameters: what the box describes.
    params: PerfParams,
    /// Base names of the batch files, for the CSV header.
    batch_files: Vec<String>,
    /// Names of the current batch test, one per batch file.
    names: Vec<String>,
    multi_thread: bool,
    extra_info: String,
}

impl Reporter {
    /// A reporter for the command line's `params`. `is_server` is true for the process
    /// without a host name (it prints the box, the client prints the rows); a loopback run
    /// prints both whatever `is_server` says.
    pub fn new(params: &PerfParams, is_server: bool) -> Self {
        Reporter {
            print_test: is_server || params.loopback,
            print_results: !is_server || params.loopback,
            final_only: params.final_only,
            csv: params.csv,
            numeric: params.numeric,
            extra: params.extra_info,
            params: params.clone(),
            batch_files: params
                .batch_files
                .iter()
                .map(|p| p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned()))
                .collect(),
            names: Vec::new(),
            multi_thread: params.threads > 1,
            extra_info: String::new(),
        }
    }

    /// True if this side prints the column header and the rows.
    pub fn prints_results(&self) -> bool {
        self.print_results
    }

    /// Sets the text `-I` appends to the following rows (the reference's UCP tests describe
    /// the protocol there; UCT tests leave it empty, so only tests set it until UCP lands).
    #[cfg(test)]
    pub fn set_extra_info(&mut self, info: &str) {
        self.extra_info.clear();
        self.extra_info.push_str(info);
    }

    /// Prints the box describing the test and the column header (once per run, before the
    /// first test).
    pub fn header(&mut self, out: &mut dyn Write) -> io::Result<()> {
        let p = &self.params;
        if self.print_test && p.has_test {
            let (api, layout) = match p.test.api() {
                Api::Uct => ("transport layer", p.layout.display_name()),
                Api::Ucp => ("protocol layer", "(automatic)"),
            };
            writeln!(out, "{BOX_LINE}")?;
            box_line(out, "API:", api)?;
            box_line(out, "Test:", p.test.short_description())?;
            box_line(out, "Data layout:", layout)?;
            box_line(out, "Send memory:", p.send_mem.name())?;
            box_line(out, "Recv memory:", p.recv_mem.name())?;
            box_line(out, "Message size:", &p.message_size().to_string())?;
            if p.test.api() == Api::Ucp && p.test.command() == Command::Am {
                writeln!(out, "| AM header size: {:<60}             |", p.ucp_am_hdr_size)?;
            }
        }
        if self.csv {
            if self.print_results {
                for f in &self.batch_files {
                    write!(out, "{f},")?;
                }
                writeln!(
                    out,
                    "iterations,{:.1}_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr",
                    p.percentile
                )?;
            }
        } else if self.print_results {
            let label = if p.has_test { p.test.latency_label() } else { "overhead" };
            writeln!(out, "{TABLE_LINE}")?;
            writeln!(
                out,
                "|              |              |       {label:>8} (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |"
            )?;
            writeln!(out, "{COLUMN_LINE}")?;
            let stage = if self.final_only { "Test" } else { "Stage" };
            writeln!(
                out,
                "|    {stage:>5}     | # iterations | {:4.1}%ile | average | overall |  average |  overall |  average  |  overall  |",
                p.percentile
            )?;
            writeln!(out, "{COLUMN_LINE}")?;
        } else if self.print_test {
            writeln!(out, "{BOX_LINE}")?;
        }
        out.flush()
    }

    /// Starts one test of the run: remembers its batch names (for `-f` and `-v` rows) and,
    /// in batch runs without `-f`/`-v`, prints the separator line that names it
    /// (`+lat1/B1-----+---...`).
    pub fn begin_test(&mut self, out: &mut dyn Write, test: &PerfParams) -> io::Result<()> {
        self.names.clone_from(&test.batch_names);
        self.multi_thread = test.threads > 1;
        if self.csv || self.final_only || self.params.batch_files.is_empty() || !self.print_results {
            return Ok(());
        }
        let name = self.names.join("/");
        let mut line = String::with_capacity(COLUMN_LINE.len().max(name.len() + 1));
        line.push('+');
        line.push_str(&name);
        if let Some(rest) = COLUMN_LINE.get(1 + name.len()..) {
            line.push_str(rest);
        }
        writeln!(out, "{line}")?;
        out.flush()
    }

    /// Prints a progress row (nothing under `-f` or on the side that does not print results).
    pub fn progress(&mut self, out: &mut dyn Write, r: &PerfResult) -> io::Result<()> {
        if !self.print_results || self.final_only {
            return Ok(());
        }
        self.row(out, r, false)
    }

    /// Prints the final row of a test (nothing on the side that does not print results).
    pub fn final_row(&mut self, out: &mut dyn Write, r: &PerfResult) -> io::Result<()> {
        if !self.print_results {
            return Ok(());
        }
        self.row(out, r, true)
    }

    fn row(&self, out: &mut dyn Write, r: &PerfResult, last: bool) -> io::Result<()> {
        let mut s = String::with_capacity(128);
        if self.csv {
            for n in &self.names {
                s.push_str(n);
                s.push(',');
            }
        }
        if !last {
            s.push_str("[thread 0]");
        } else if !self.csv {
            if self.final_only {
                s.push_str(&format!("{:>10}", self.names.join("/")));
            } else {
                s.push_str("Final:    ");
            }
        }
        let iters = r.iters as f64;
        if self.multi_thread && last {
            if self.csv {
                s.push_str(&format!(
                    "{},{},{},{}",
                    fmt_f(iters, 4, 0),
                    fmt_f(r.lat_overall_us, 0, 3),
                    fmt_f(r.bw_overall_mbs, 0, 2),
                    fmt_f(r.msgrate_overall, 0, 0)
                ));
            } else {
                let (group, rate_width) = if self.numeric { (true, 24) } else { (false, 23) };
                s.push_str(&format!(
                    "{} {} {} {}",
                    fmt_g(iters, 18, group),
                    fmt_f(r.lat_overall_us, 29, 3),
                    fmt_f(r.bw_overall_mbs, 22, 2),
                    fmt_g(r.msgrate_overall, rate_width, group)
                ));
            }
        } else if self.csv {
            s.push_str(&format!(
                "{},{},{},{},{},{},{},{}",
                fmt_f(iters, 4, 0),
                fmt_f(r.lat_percentile_us, 0, 3),
                fmt_f(r.lat_avg_us, 0, 3),
                fmt_f(r.lat_overall_us, 0, 3),
                fmt_f(r.bw_avg_mbs, 0, 2),
                fmt_f(r.bw_overall_mbs, 0, 2),
                fmt_f(r.msgrate_avg, 0, 0),
                fmt_f(r.msgrate_overall, 0, 0)
            ));
        } else {
            let g = self.numeric;
            s.push_str(&format!(
                "{} {} {} {} {} {} {} {}",
                fmt_g(iters, 18, g),
                fmt_f(r.lat_percentile_us, 10, 3),
                fmt_f(r.lat_avg_us, 9, 3),
                fmt_f(r.lat_overall_us, 9, 3),
                fmt_f(r.bw_avg_mbs, 11, 2),
                fmt_f(r.bw_overall_mbs, 10, 2),
                fmt_g(r.msgrate_avg, 11, g),
                fmt_g(r.msgrate_overall, 11, g)
            ));
        }
        if self.extra && !self.csv {
            s.push_str("  ");
            s.push_str(&self.extra_info);
        }
        s.push('\n');
        out.write_all(s.as_bytes())?;
        out.flush()
    }
}

/// `| <label padded to 14><value padded to 60>  ...  |`, 108 columns.
fn box_line(out: &mut dyn Write, label: &str, value: &str) -> io::Result<()> {
    writeln!(out, "| {label:<14}{value:<60}{:31}|", "")
}

/// `printf("%<width>.<prec>f", v)`, including glibc's spelling of infinities and NaNs.
fn fmt_f(v: f64, width: usize, prec: usize) -> String {
    if v.is_nan() {
        let s = if v.is_sign_negative() { "-nan" } else { "nan" };
        format!("{s:>width$}")
    } else if v.is_infinite() {
        let s = if v < 0.0 { "-inf" } else { "inf" };
        format!("{s:>width$}")
    } else {
        format!("{v:>width$.prec$}")
    }
}

/// `printf("%'<width>.0f", v)` in the `en_US` locale when `group`, else `%<width>.0f`.
fn fmt_g(v: f64, width: usize, group: bool) -> String {
    if !group || !v.is_finite() {
        return fmt_f(v, width, 0);
    }
    let plain = format!("{v:.0}");
    let (sign, digits) = match plain.strip_prefix('-') {
        Some(d) => ("-", d),
        None => ("", plain.as_str()),
    };
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    grouped.push_str(sign);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(ch);
    }
    format!("{grouped:>width$}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::opts::{parse, Parsed};
    use ucx_perf::params::DataLayout;

    fn params(s: &str) -> PerfParams {
        let a: Vec<String> = s.split_whitespace().map(str::to_string).collect();
        match parse(&a) {
            Ok(Parsed::Run(p)) => p,
            other => panic!("{other:?}"),
        }
    }

    fn text(f: impl FnOnce(&mut Vec<u8>) -> io::Result<()>) -> String {
        let mut v = Vec::new();
        f(&mut v).unwrap();
        String::from_utf8(v).unwrap()
    }

    fn sample() -> PerfResult {
        PerfResult {
            iters: 3_000_000,
            bytes: 24_000_000,
            elapsed_s: 0.036,
            lat_percentile_us: 0.010,
            lat_avg_us: 0.012,
            lat_overall_us: 0.012,
            bw_avg_mbs: 620.8,
            bw_overall_mbs: 620.8,
            msgrate_avg: 81_369_327.0,
            msgrate_overall: 81_369_327.0,
        }
    }

    const BOX_AM_LAT: &str = "\
+----------------------------------------------------------------------------------------------------------+
| API:          transport layer                                                                            |
| Test:         active message latency                                                                     |
| Data layout:  short                                                                                      |
| Send memory:  host                                                                                       |
| Recv memory:  host                                                                                       |
| Message size: 8                                                                                          |
";

    const TABLE_LAT: &str = "\
+--------------+--------------+------------------------------+---------------------+-----------------------+
|              |              |        latency (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
";

    #[test]
    fn loopback_output_is_the_reference_output() {
        let p = params("-l -t am_lat -x posix -d memory -n 3000000");
        let mut r = Reporter::new(&p, true);
        let out = text(|o| {
            r.header(o)?;
            r.begin_test(o, &p)?;
            r.final_row(o, &sample())
        });
        let expected = format!(
            "{BOX_AM_LAT}{TABLE_LAT}Final:               3000000      0.010     0.012     0.012      620.80     620.80    81369327    81369327\n"
        );
        assert_eq!(out, expected);
    }

    #[test]
    fn progress_rows_and_extra_info() {
        let p = params("-l -t am_lat -x posix -d memory -I");
        let mut r = Reporter::new(&p, false);
        let row = PerfResult {
            iters: 5_353_838,
            lat_percentile_us: 0.085,
            lat_avg_us: 0.093,
            lat_overall_us: 0.093,
            bw_avg_mbs: 81.79,
            bw_overall_mbs: 81.79,
            msgrate_avg: 10_720_712.0,
            msgrate_overall: 10_720_712.0,
            ..Default::default()
        };
        let out = text(|o| r.progress(o, &row));
        assert_eq!(
            out,
            "[thread 0]           5353838      0.085     0.093     0.093       81.79      81.79    10720712    10720712  \n"
        );
        r.set_extra_info("eager");
        assert!(text(|o| r.final_row(o, &row)).ends_with("10720712  eager\n"));
    }

    #[test]
    fn server_and_client_split_the_output() {
        let s = params("-t am_lat -x posix -d memory");
        let mut server = Reporter::new(&s, true);
        assert!(!server.prints_results());
        let out = text(|o| {
            server.header(o)?;
            server.progress(o, &sample())?;
            server.final_row(o, &sample())
        });
        assert_eq!(out, format!("{BOX_AM_LAT}{BOX_LINE}\n"));

        let c = params("host -t am_lat -x posix -d memory");
        let mut client = Reporter::new(&c, false);
        let out = text(|o| client.header(o));
        assert_eq!(out, TABLE_LAT);

        // CSV server: the box without its closing line.
        let s = params("-t am_lat -x posix -d memory -v");
        let out = text(|o| Reporter::new(&s, true).header(o));
        assert_eq!(out, BOX_AM_LAT);

        // A server that has no test yet prints only the closing line.
        let out = text(|o| Reporter::new(&params(""), true).header(o));
        assert_eq!(out, format!("{BOX_LINE}\n"));
    }

    #[test]
    fn final_only() {
        let p = params("-l -t put_bw -x posix -d memory -n 100000 -f -I");
        let mut r = Reporter::new(&p, true);
        let row = PerfResult {
            iters: 100_000,
            lat_percentile_us: 0.010,
            lat_avg_us: 0.011,
            lat_overall_us: 0.011,
            bw_avg_mbs: 678.83,
            bw_overall_mbs: 678.83,
            msgrate_avg: 88_975_477.0,
            msgrate_overall: 88_975_477.0,
            ..Default::default()
        };
        let out = text(|o| {
            r.header(o)?;
            r.begin_test(o, &p)?;
            r.progress(o, &row)?;
            r.final_row(o, &row)
        });
        assert!(out.contains("|       overhead (usec)        |"));
        assert!(out.contains("\n|     Test     | # iterations | 50.0%ile |"));
        assert!(out.ends_with(
            "+\n                      100000      0.010     0.011     0.011      678.83     678.83    88975477    88975477  \n"
        ));
        assert!(!out.contains("[thread"));
        assert!(out.starts_with(BOX_LINE));
    }

    #[test]
    fn csv() {
        let p = params("-l -t put_bw -x posix -d memory -v -I -R 99.9");
        let mut r = Reporter::new(&p, true);
        let row = PerfResult { iters: 10, lat_percentile_us: 0.01, msgrate_avg: 2.5, ..sample() };
        let out = text(|o| {
            r.header(o)?;
            r.progress(o, &row)?;
            r.final_row(o, &row)
        });
        let (head, rows) = out.split_at(out.find("iterations,").unwrap());
        assert!(head.starts_with(BOX_LINE) && head.ends_with("| Message size: 8                                                                                          |\n"));
        assert_eq!(
            rows,
            "iterations,99.9_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n\
             [thread 0]  10,0.010,0.012,0.012,620.80,620.80,2,81369327\n  10,0.010,0.012,0.012,620.80,620.80,2,81369327\n"
        );
    }

    #[test]
    fn numeric_grouping() {
        let p = params("-l -t am_lat -x posix -d memory -N");
        let mut r = Reporter::new(&p, true);
        let out = text(|o| r.final_row(o, &sample()));
        assert_eq!(
            out,
            "Final:             3,000,000      0.010     0.012     0.012      620.80     620.80  81,369,327  81,369,327\n"
        );
        assert_eq!(fmt_g(999.0, 5, true), "  999");
        assert_eq!(fmt_g(1000.0, 0, true), "1,000");
        assert_eq!(fmt_g(-1234567.0, 0, true), "-1,234,567");
        assert_eq!(fmt_g(f64::INFINITY, 5, true), "  inf");
    }

    #[test]
    fn printf_spelling_of_special_values() {
        assert_eq!(fmt_f(f64::INFINITY, 10, 3), "       inf");
        assert_eq!(fmt_f(f64::NEG_INFINITY, 6, 3), "  -inf");
        assert_eq!(fmt_f(-f64::NAN, 9, 3), "     -nan");
        assert_eq!(fmt_f(f64::NAN.copysign(1.0), 4, 0), " nan");
        // Ties round to even on the exact binary value, as glibc does.
        assert_eq!(fmt_f(2.5, 0, 0), "2");
        assert_eq!(fmt_f(0.125, 0, 2), "0.12");
        assert_eq!(fmt_f(1e7, 4, 0), "10000000");
    }

    #[test]
    fn batch_names_in_rows() {
        let dir = std::env::temp_dir().join(format!("ucx-perf-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("b1.txt");
        std::fs::write(&f, "lat1 -t am_lat -n 1000\n").unwrap();
        let base = format!("-l -x posix -d memory -b {}", f.display());
        let tests = crate::opts::expand_batch(&params(&base)).unwrap();

        // Plain: header without the box (no -t on the command line), a named separator.
        let p = params(&base);
        let mut r = Reporter::new(&p, true);
        let out = text(|o| {
            r.header(o)?;
            r.begin_test(o, &tests[0])?;
            r.final_row(o, &sample())
        });
        assert!(out.starts_with(TABLE_LINE));
        assert!(out.contains("|       overhead (usec)        |"));
        assert!(out.contains(
            "\n+lat1----------+--------------+----------+---------+---------+----------+----------+-----------+-----------+\nFinal:  "
        ));

        // -f: the name right-aligned in 10 columns.
        let p = params(&format!("{base} -f"));
        let mut r = Reporter::new(&p, true);
        let out = text(|o| {
            r.begin_test(o, &tests[0])?;
            r.final_row(o, &sample())
        });
        assert!(out.starts_with("      lat1           3000000 "), "{out}");

        // -v: file base names in the header, test names in the rows.
        let p = params(&format!("{base} -v"));
        let mut r = Reporter::new(&p, true);
        let out = text(|o| {
            r.header(o)?;
            r.begin_test(o, &tests[0])?;
            r.final_row(o, &sample())
        });
        assert_eq!(
            out,
            "b1.txt,iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n\
             lat1,3000000,0.010,0.012,0.012,620.80,620.80,81369327,81369327\n"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn long_batch_names_extend_the_separator() {
        let p = params("-l -x posix -d memory -b x");
        let mut r = Reporter::new(&p, true);
        let mut t = p.clone();
        t.batch_names = vec!["n".repeat(120)];
        let out = text(|o| r.begin_test(o, &t));
        assert_eq!(out, format!("+{}\n", "n".repeat(120)));
    }

    #[test]
    fn ucp_box_and_multi_thread_final() {
        let p = params("-l -t ucp_am_lat -H 16 -T 2");
        let mut r = Reporter::new(&p, true);
        let out = text(|o| {
            r.header(o)?;
            r.final_row(o, &sample())
        });
        assert!(out.contains("| API:          protocol layer "));
        assert!(out.contains("| Data layout:  (automatic) "));
        assert!(out.contains(&format!("| AM header size: {:<60}             |\n", 16)));
        assert!(out
            .ends_with(&format!("Final:    {:>18} {:>29} {:>22} {:>23}\n", "3000000", "0.012", "620.80", "81369327")));
    }

    #[test]
    fn every_layout_fits_the_box() {
        for l in [DataLayout::Short, DataLayout::ShortIov, DataLayout::Bcopy, DataLayout::Zcopy] {
            let mut p = params("-l -t am_lat -x posix -d memory");
            p.layout = l;
            let out = text(|o| Reporter::new(&p, true).header(o));
            assert!(out.lines().all(|line| line.len() == 108), "{out}");
            assert!(out.contains(&format!("| Data layout:  {:<60}", l.display_name())));
        }
    }
}
