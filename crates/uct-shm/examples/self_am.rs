//! Sends active messages over the `self` transport and prints what arrived.
//!
//! ```text
//! cargo run -p uct-shm --example self_am -- [COUNT]
//! ```
//! Shows the whole UCT flow: discovery, memory domain, interface, endpoint, AM handler, short and
//! bcopy sends, a kept descriptor, a put into registered memory and a fetching atomic.

use std::cell::RefCell;
use std::rc::Rc;

use uct::{AmDesc, AmRecv, AtomicOp, EpParams, IfaceParams, MemAccess, Outcome, SendFlags, Worker};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let count: u64 = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(4);
    ucs::log::init();
    uct_shm::register();

    println!("resources:");
    for r in uct::query_resources() {
        println!("  {:<16} {:?} (component {}, md {})", r.tl.full_name(), r.tl.dev_type, r.component, r.md_name);
    }

    let worker = Worker::default();
    let (md, iface) = uct::iface_open_by_name(&worker, "self/memory0", IfaceParams::default())?;
    ucs::config::warn_unused_env_vars();
    let attr = iface.attr();
    println!(
        "self/memory0: am.max_short {} am.max_bcopy {} flags {:?}",
        attr.am.max_short, attr.am.max_bcopy, attr.flags
    );

    // Handler for AM id 1: print every message; keep the first one.
    let kept: Rc<RefCell<Option<AmDesc>>> = Rc::default();
    let k2 = kept.clone();
    iface.set_am_handler(
        1,
        Some(Rc::new(move |m: AmRecv<'_>| {
            let d = m.data();
            let header = u64::from_ne_bytes(d[..8].try_into().unwrap_or_default());
            println!("  received {} bytes: header {header:#x} payload {:?}", d.len(), String::from_utf8_lossy(&d[8..]));
            if k2.borrow().is_none() {
                *k2.borrow_mut() = Some(m.keep());
            }
        })),
    )?;
    let ep = iface.ep_create(&EpParams::to_iface(&iface.device_address(), &iface.iface_address()))?;

    for i in 0..count {
        let text = format!("short message {i}");
        match ep.am_short(1, 0x1000 + i, text.as_bytes())? {
            Outcome::Done(()) => {}
            other => println!("  am_short: {other:?}"),
        }
    }
    let sent = ep.am_bcopy(
        1,
        &mut |buf: &mut [u8]| {
            let msg = b"\x2a\0\0\0\0\0\0\0bcopy message";
            buf[..msg.len()].copy_from_slice(msg);
            msg.len()
        },
        SendFlags::empty(),
    )?;
    println!("am_bcopy sent {sent:?}");
    if let Some(d) = kept.borrow_mut().take() {
        println!("kept descriptor still holds {:?}", String::from_utf8_lossy(&d[8..]));
    }

    // RMA and atomics on registered memory.
    let mut target = vec![0u64; 4].into_boxed_slice();
    // SAFETY: `target` outlives the registration (`memh` is dropped first, below) and is not
    // borrowed while remote operations run.
    let memh = unsafe { md.mem_reg(target.as_mut_ptr().cast(), 32, MemAccess::ALL)? };
    let rkey = md.component().rkey_unpack(&md.mkey_pack(&memh)?)?;
    let base = memh.address() as u64;
    let _ = ep.put_short(&7u64.to_ne_bytes(), base, &rkey)?;
    let mut old = 0u64;
    // SAFETY: `old` lives across the call; self completes atomics immediately.
    let _ = unsafe { ep.atomic64_fetch(AtomicOp::Add, 5, &mut old, base, &rkey, None)? };
    drop(ep);
    drop(memh);
    println!("put 7, fetch-add 5: fetched {old}, memory now {}", target[0]);
    drop(iface);
    Ok(())
}
