//! Checking a test's parameters as the reference does before it touches a transport, and the
//! errors about resources.

use ucx_perf::params::*;

/// Checks a test's parameters as the reference does before it opens a transport. Limits that
/// depend on the transport (largest short/bcopy/zcopy size, io-vector entries, whether the
/// transport/device exists) are the caller's: see [`unknown_resource_error`].
pub fn validate(p: &PerfParams) -> Result<(), String> {
    if !p.has_test {
        return Err(format!("missing test name: use -t <test> (valid: {})", valid_tests()));
    }
    let test = p.test;
    let name = test.name();
    let cmd = test.command();
    let size = p.message_size();
    if p.max_outstanding < 1 {
        return Err("max_outstanding (-O) must be at least 1".to_string());
    }
    let zero_size_ok =
        test.api() == Api::Ucp && matches!(cmd, Command::Am | Command::Tag | Command::TagSync | Command::Stream);
    if size < 1 && !zero_size_ok {
        return Err(format!("message size too small for test '{name}': need at least 1 byte (-s)"));
    }
    if p.iov_stride != 0 {
        if let Some(&big) = p.msg_sizes.iter().find(|&&s| s > p.iov_stride) {
            return Err(format!("buffer size {big} bigger than stride {} (-s, -i)", p.iov_stride));
        }
    }
    if test.api() == Api::Ucp {
        return Ok(());
    }

    // UCT tests from here on.
    // No -d is accepted (unlike the reference): the caller takes the transport's only device,
    // or reports the choices with `missing_device_error`.
    if p.tl.is_none() {
        return Err(format!("a transport must be specified with -x for UCT test '{name}' (e.g. -x posix)"));
    }
    if p.threads > 1 {
        return Err(format!("UCT tests do not support multi-thread mode (-T {})", p.threads));
    }
    if cmd.is_atomic() {
        // The layout is not used by atomics (the reference ignores -D for them).
        if size != 4 && size != 8 {
            return Err(format!("invalid message size {size} for atomic test '{name}' (valid: 4, 8)"));
        }
        return Ok(());
    }
    match (cmd, p.layout) {
        (Command::Get, DataLayout::Short) => {
            return Err(format!(
                "data layout 'short' cannot be used for test '{name}' (valid: bcopy, zcopy; e.g. -D bcopy)"
            ))
        }
        (Command::Get, DataLayout::ShortIov) | (Command::Put, DataLayout::ShortIov) => {
            return Err(format!(
                "data layout 'shortiov' is only for active messages, not for test '{name}' \
                 (valid: short, bcopy, zcopy)"
            ))
        }
        _ => {}
    }
    if cmd == Command::Am {
        if p.layout == DataLayout::Short && p.am_hdr_size != 8 {
            return Err(format!("short AM header size must be 8 bytes (-H {})", p.am_hdr_size));
        }
        if p.am_hdr_size > size {
            return Err(format!("AM header size ({}) is larger than message size ({size})", p.am_hdr_size));
        }
        if p.fc_window > MAX_FC_WINDOW {
            return Err(format!("AM flow-control window ({}) too large (valid: 0..{MAX_FC_WINDOW})", p.fc_window));
        }
        if p.layout == DataLayout::Zcopy && p.msg_sizes.len() > 1 && p.am_hdr_size > p.msg_sizes[0] {
            return Err(format!(
                "AM header size ({}) larger than the first IOV message size ({})",
                p.am_hdr_size, p.msg_sizes[0]
            ));
        }
    }
    Ok(())
}

/// The one-line error for a UCT test without `-d` whose transport has several devices (or
/// none); `devices` are that transport's devices.
pub fn missing_device_error(tl: &str, devices: &[String]) -> String {
    if devices.is_empty() {
        format!("transport '{tl}' has no devices here")
    } else {
        format!("a device must be specified with -d for transport '{tl}' (valid: {})", devices.join(", "))
    }
}

/// The one-line error for a `-x`/`-d` pair that no transport offers; `valid` lists the
/// available pairs as `tl/dev` (e.g. `posix/memory`).
pub fn unknown_resource_error(tl: &str, dev: &str, valid: &[String]) -> String {
    if valid.is_empty() {
        format!("cannot use {tl}/{dev}: no transports are available")
    } else {
        format!("cannot use {tl}/{dev} (valid: {})", valid.join(", "))
    }
}
