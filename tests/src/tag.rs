//! What the tag-matching tests and their sender peer share.

use ucp::{Endpoint, Request, RequestParam, SendData};

use crate::text::pattern;

/// Starts sending `pattern(len, seed)` with `tag` (synchronous send when `sync`); the caller
/// keeps the returned data until the request (if any) completed.
pub fn start_send(ep: &Endpoint, tag: u64, len: usize, seed: u64, sync: bool) -> (Vec<u8>, Option<Request<'_>>) {
    let data = pattern(len, seed);
    // SAFETY: the Vec's heap buffer does not move when the Vec moves to the caller, who keeps
    // it until the request completed.
    let r = unsafe {
        let d = SendData::Contig(std::slice::from_raw_parts(data.as_ptr(), data.len()));
        if sync {
            ep.tag_send_sync_nbx(d, tag, RequestParam::new())
        } else {
            ep.tag_send_nbx(d, tag, RequestParam::new())
        }
    }
    .unwrap();
    (data, r)
}

/// Tag of the message `ucp-peer dying` sends whole before it dies.
pub const DYING_SMALL: u64 = 1;
/// Tag of its rendezvous, never served.
pub const DYING_BIG: u64 = 2;
/// Length of that rendezvous.
pub const DYING_BIG_LEN: usize = 256 * 1024;
