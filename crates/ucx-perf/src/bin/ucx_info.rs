//! `ucx_info`: lists transport resources and prints configuration, like UCX's tool.
//!
//! ```text
//! ucx_info -d     transports and devices found here (and components unavailable, with why)
//! ucx_info -c     every UCX_* option with its current value
//! ucx_info -cf    the same with each option's documentation
//! ```

use std::process::ExitCode;
use std::rc::Rc;

use uct::{IfaceFlags, IfaceParams, TagHandlers, Worker};

fn usage() -> ExitCode {
    eprintln!("usage: ucx_info [-d] [-c] [-f]\n  -d  show transports and devices\n  -c  show configuration\n  -f  with -c, show documentation of each option");
    ExitCode::from(1)
}

fn main() -> ExitCode {
    let (mut devices, mut config, mut docs) = (false, false, false);
    for arg in std::env::args().skip(1) {
        let Some(flags) = arg.strip_prefix('-') else { return usage() };
        for c in flags.chars() {
            match c {
                'd' => devices = true,
                'c' => config = true,
                'f' => docs = true,
                'h' => {
                    usage();
                    return ExitCode::SUCCESS;
                }
                other => {
                    eprintln!("ucx_info: invalid option -{other} (valid: -d -c -f -h)");
                    return ExitCode::from(1);
                }
            }
        }
    }
    if !(devices || config) {
        return usage();
    }
    // Like the C tool: end quietly when the reader of a pipe goes away (`ucx_info -d | head`).
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    ucs::log::init();
    uct_shm::register();
    uct_ib::register();
    uct_tcp::register();
    let worker = Worker::default();
    let resources = uct::query_resources();
    // Opening each interface reads its configuration table, so -c can print it.
    for r in &resources {
        let name = r.tl.full_name();
        // With tag handlers, so that tag offload shows where it is configured on
        // (`UCX_RC_TM_ENABLE=y`); no tagged message reaches them.
        let params = IfaceParams {
            tag_handlers: Some(TagHandlers { eager: Rc::new(|_| {}), rndv: Rc::new(|_| {}) }),
            ..IfaceParams::default()
        };
        match uct::iface_open_by_name(&worker, &name, params) {
            Ok((_, iface)) if devices => {
                let a = iface.attr();
                println!("#   Transport: {}", r.tl.tl_name);
                println!("#      Device: {}", r.tl.dev_name);
                println!("#        Type: {}", r.tl.dev_type.as_str());
                println!("#   Component: {} (memory domain {})", r.component, r.md_name);
                println!(
                    "#   bandwidth: {:.2}/ppn + {:.2} MB/sec",
                    a.bandwidth.dedicated / 1048576.0,
                    a.bandwidth.shared / 1048576.0
                );
                println!("#     latency: {:.0} nsec", a.latency.c * 1e9);
                println!("#    am_short: <= {}   am_bcopy: <= {}", a.am.max_short, a.am.max_bcopy);
                println!("#       flags: {:?}", a.flags);
                if a.flags.intersects(
                    IfaceFlags::TAG_EAGER_SHORT
                        | IfaceFlags::TAG_EAGER_BCOPY
                        | IfaceFlags::TAG_EAGER_ZCOPY
                        | IfaceFlags::TAG_RNDV_ZCOPY,
                ) {
                    let t = &a.tag;
                    println!(
                        "# tag offload: {}eager_short <= {}   eager_bcopy <= {}   eager_zcopy <= {}",
                        if t.emulated { "EMULATED (software model of the adapter's matching)   " } else { "" },
                        t.eager.max_short,
                        t.eager.max_bcopy,
                        t.eager.max_zcopy
                    );
                    println!(
                        "#              rndv_zcopy <= {}   rndv_hdr <= {}   recv_zcopy <= {}   tag_max_outstanding: {}",
                        t.rndv.max_zcopy, t.rndv.max_hdr, t.recv_max_zcopy, t.recv_max_outstanding
                    );
                }
                println!("#");
            }
            Ok(_) => {}
            Err(e) => eprintln!("ucx_info: cannot open {name}: {e}"),
        }
    }
    if devices {
        for (name, why) in uct::unavailable_components() {
            println!("# component {name} unavailable: {why}");
        }
    }
    if config {
        print!("{}", ucs::config::print_all(docs));
    }
    ExitCode::SUCCESS
}
