//! Re-entrant use of the `self` transport from callbacks: no deadlock, no RefCell panic.

use std::cell::RefCell;
use std::rc::Rc;

use uct::{AmRecv, EpParams, IfaceParams, MemAccess, MemH, Outcome, Status, Worker};

#[test]
fn pack_callback_deregistering_its_target_fails_cleanly() {
    uct_shm::register();
    let worker = Worker::default();
    let (md, iface) = uct::iface_open_by_name(&worker, "self/memory0", IfaceParams::default()).unwrap();
    let ep = iface.ep_create(&EpParams::to_iface(&iface.device_address(), &iface.iface_address())).unwrap();
    let mut target = vec![0u8; 64];
    // SAFETY: `target` outlives the registration (dropped inside the pack callback below).
    let memh: Rc<RefCell<Option<MemH>>> =
        Rc::new(RefCell::new(Some(unsafe { md.mem_reg(target.as_mut_ptr(), 64, MemAccess::ALL) }.unwrap())));
    let rkey = md.component().rkey_unpack(&md.mkey_pack(memh.borrow().as_ref().unwrap()).unwrap()).unwrap();
    let base = rkey.base();
    let m2 = memh.clone();
    let r = ep.put_bcopy(
        &mut |b: &mut [u8]| {
            m2.borrow_mut().take(); // deregister while packing
            b[..4].copy_from_slice(b"late");
            4
        },
        base,
        &rkey,
    );
    assert_eq!(r, Err(Status::InvalidParam), "the region was deregistered before the copy");
    assert_eq!(&target[..4], &[0, 0, 0, 0], "nothing written after deregistration");
}

#[test]
fn handler_replacing_itself_and_sending_again() {
    uct_shm::register();
    let worker = Worker::default();
    let (_md, iface) = uct::iface_open_by_name(&worker, "self/memory0", IfaceParams::default()).unwrap();
    let iface: Rc<Box<dyn uct::Iface>> = Rc::new(iface);
    let ep: Rc<Box<dyn uct::Ep>> =
        Rc::new(iface.ep_create(&EpParams::to_iface(&iface.device_address(), &iface.iface_address())).unwrap());
    let log: Rc<RefCell<Vec<u64>>> = Rc::default();
    let (i2, e2, l2) = (Rc::downgrade(&iface), Rc::downgrade(&ep), log.clone());
    iface
        .set_am_handler(
            2,
            Some(Rc::new(move |m: AmRecv<'_>| {
                let h = u64::from_ne_bytes(m.data()[..8].try_into().unwrap());
                l2.borrow_mut().push(h);
                if h == 1 {
                    // Replace this handler from inside itself, then send to the new one.
                    let l3 = l2.clone();
                    let iface = i2.upgrade().unwrap();
                    iface
                        .set_am_handler(
                            2,
                            Some(Rc::new(move |m: AmRecv<'_>| l3.borrow_mut().push(100 + m.data()[0] as u64))),
                        )
                        .unwrap();
                    assert_eq!(e2.upgrade().unwrap().am_short(2, 7, &[]), Ok(Outcome::Done(())));
                }
            })),
        )
        .unwrap();
    assert_eq!(ep.am_short(2, 1, &[]), Ok(Outcome::Done(())));
    assert_eq!(*log.borrow(), [1, 107]);
}
