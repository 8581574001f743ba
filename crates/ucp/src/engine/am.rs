//! Arrivals: the dispatch of UCP's active messages to their protocols.

use uct::AmRecv;

use super::Engine;
use crate::proto::{eager, rndv};
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
            return self.tag.on_eager(&mut self.sh, m);
        }
        self.on_am_other(id, m);
        None
    }

    #[inline(never)]
    fn on_am_other(&mut self, id: u8, m: AmRecv<'_>) {
        let (sh, tag) = (&mut self.sh, &mut self.tag);
        if id == wire::AM_EAGER_SYNC_ONLY {
            // It keeps its transport buffer when unexpected: it takes `m`.
            return tag.on_eager_sync(sh, m);
        }
        match Msg::decode(id, m.data()) {
            Ok(Msg::EagerFirst(h, payload)) => tag.on_eager_first(sh, h, payload),
            Ok(Msg::EagerMiddle(h, payload)) => tag.on_eager_middle(sh, h, payload),
            Ok(Msg::Rts(h)) => tag.on_rts(sh, h),
            Ok(Msg::SyncAck(h)) => eager::on_sync_ack(sh, h),
            Ok(Msg::OffloadSyncAck(h)) => eager::on_offload_sync_ack(sh, h),
            Ok(Msg::Ats(h)) => rndv::on_ats(sh, h),
            Ok(Msg::Rtr(h)) => rndv::on_rtr(sh, h),
            Ok(Msg::RndvData(h, payload)) => rndv::on_data(sh, h, payload),
            Ok(Msg::Atp(h)) => rndv::on_atp(sh, h),
            Ok(Msg::Wireup(w)) => self.conn.on_wireup(sh, &w),
            Ok(Msg::RmaGetRep(h, payload)) => crate::rma::sw::on_get_rep(sh, h, payload),
            Ok(Msg::AmoRep(h)) => crate::rma::sw::on_amo_rep(sh, h),
            Ok(Msg::RmaFlush(h)) => crate::rma::sw::on_flush(sh, h),
            // The driver hands these to the active-message family.
            Ok(Msg::Am(..) | Msg::AmFirst(..) | Msg::AmMiddle(..) | Msg::AmRts(..) | Msg::Stream(..)) => {
                tracing::warn!("ucp: {} reached the engine; dropped", wire::am_name(id))
            }
            // Applied to memory by the driver, which never hands them here.
            Ok(Msg::RmaPut(..) | Msg::RmaGet(_) | Msg::Amo(_)) => {
                tracing::warn!("ucp: {} reached the engine; dropped", wire::am_name(id))
            }
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
