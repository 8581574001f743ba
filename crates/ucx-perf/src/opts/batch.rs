//! `-b` batch files: every combination of one line per file, each line's options applied over
//! the command line's.

use std::path::Path;

use ucx_perf::params::*;

use super::apply::apply_test_opt;
use super::getopt::{getopt, Item};
use super::validate::validate;
use super::TEST_OPTS;

/// The tests to run: without batch files the command line's test alone (validated); with
/// them, every combination of one line per batch file (files nested in `-b` order, lines in
/// file order), each line's options applied over the previous level's parameters, as the
/// reference does. Lines are split at blanks; empty lines and lines whose first word starts
/// with `#` are skipped; the first word names the test in the output (`batch_names`), the
/// rest are test options (not `-p -b -6 -N -f -v -c -h`; `-I` means wakeup there).
///
/// Unlike the reference, which reads a batch file as it runs it, every file is read and
/// every test validated before the first one runs.
pub fn expand_batch(params: &PerfParams) -> Result<Vec<PerfParams>, String> {
    if params.batch_files.is_empty() {
        let mut p = params.clone();
        if p.has_test {
            p.resolve_window();
        }
        validate(&p)?;
        return Ok(vec![p]);
    }
    let mut files = Vec::with_capacity(params.batch_files.len());
    for path in &params.batch_files {
        let bytes = std::fs::read(path).map_err(|e| format!("failed to open batch file '{}': {e}", path.display()))?;
        files.push((path.as_path(), String::from_utf8_lossy(&bytes).into_owned()));
    }
    let mut out = Vec::new();
    expand_level(params, &files, 0, &mut out)?;
    Ok(out)
}

fn expand_level(
    parent: &PerfParams,
    files: &[(&Path, String)],
    depth: usize,
    out: &mut Vec<PerfParams>,
) -> Result<(), String> {
    let Some((path, text)) = files.get(depth) else {
        validate(parent).map_err(|e| format!("in batch test '{}': {e}", parent.batch_names.join("/")))?;
        out.push(parent.clone());
        return Ok(());
    };
    for (lineno, line) in text.lines().enumerate() {
        let words: Vec<String> = line.split([' ', '\t', '\r']).filter(|w| !w.is_empty()).map(str::to_string).collect();
        let Some(first) = words.first() else { continue };
        if first.starts_with('#') {
            continue;
        }
        let prefix = format!("in batch file '{}' line {}: ", path.display(), lineno + 1);
        let mut p = parent.clone();
        apply_batch_line(&mut p, &words[1..]).map_err(|e| format!("{prefix}{e}"))?;
        if !p.has_test {
            return Err(format!("{prefix}missing test name (valid: {})", valid_tests()));
        }
        p.resolve_window();
        p.batch_names.truncate(depth);
        p.batch_names.push(first.clone());
        expand_level(&p, files, depth + 1, out)?;
    }
    Ok(())
}

fn apply_batch_line(p: &mut PerfParams, args: &[String]) -> Result<(), String> {
    let was_loopback = p.loopback;
    for item in getopt(args, TEST_OPTS)? {
        match item {
            Item::Positional(s) => return Err(format!("unexpected argument '{s}'")),
            Item::Opt(c, arg) => apply_test_opt(p, c, arg.as_deref().unwrap_or(""))?,
        }
    }
    if p.loopback && !was_loopback {
        return Err("-l must be given on the command line, not in a batch file".to_string());
    }
    Ok(())
}
