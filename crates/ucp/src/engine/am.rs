//! Arrivals: the dispatch of UCP's active messages to their protocols.

use uct::AmRecv;

use super::Engine;
use crate::request::complete::Done;
use crate::wire::{self, Msg};

impl<L: Clone> Engine<L> {
    /// One of UCP's active messages arrived with AM id `id`: its header is decoded (a
    /// malformed one is logged with what was wrong, and dropped) and it goes to its protocol.
    /// The completion of an eager message that matched a posted receive is returned for the
    /// driver to run; everything else leaves its work in the actions.
    #[inline(always)]
    pub fn on_am(&mut self, id: u8, m: AmRecv<'_>) -> Option<Done> {
        if id == wire::AM_EAGER_ONLY {
            return self.on_eager(m);
        }
        self.on_am_other(id, m);
        None
    }

    #[inline(never)]
    fn on_am_other(&mut self, id: u8, m: AmRecv<'_>) {
        if id == wire::AM_EAGER_SYNC_ONLY {
            // It keeps its transport buffer when unexpected: it takes `m`.
            return self.on_eager_sync(m);
        }
        match Msg::decode(id, m.data()) {
            Ok(Msg::EagerFirst(h, payload)) => self.on_eager_first(h, payload),
            Ok(Msg::EagerMiddle(h, payload)) => self.on_eager_middle(h, payload),
            Ok(Msg::SyncAck(h)) => self.on_sync_ack(h),
            Ok(Msg::Rts(h)) => self.on_rts(h),
            Ok(Msg::Ats(h)) => self.on_ats(h),
            Ok(Msg::Rtr(h)) => self.on_rtr(h),
            Ok(Msg::RndvData(h, payload)) => self.on_rndv_data(h, payload),
            Ok(Msg::Atp(h)) => self.on_atp(h),
            Ok(Msg::Wireup(w)) => self.on_wireup(&w),
            Ok(Msg::Eager(h, _)) => tracing::warn!("ucp: eager message {:#x} on the wrong id; dropped", h.tag),
            Ok(Msg::EagerSync(h, _)) => tracing::warn!("ucp: eager sync message {:#x} on the wrong id; dropped", h.tag),
            Err(e) => malformed(e),
        }
    }
}

/// A malformed protocol message: logged with what was wrong, and dropped.
#[cold]
#[inline(never)]
pub(crate) fn malformed(e: wire::WireError) {
    tracing::warn!("ucp: {e}; message dropped");
}
