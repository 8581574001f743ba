//! Probing the unexpected queue (`ucp_tag_probe_nb`) and receiving a message taken out by a
//! probe (`ucp_tag_msg_recv_nbx`).

use ucs::idtable::Id;
use ucs::{Status, UcsResult};

use super::recv::RecvOut;
use super::{FragTarget, Tag, TagState, Unexp};
use crate::dt::UserBuf;
use crate::engine::Shared;
use crate::request::{RecvInfo, RequestParam};

impl TagState {
    /// Looks at the unexpected queue; with `remove`, takes the message out into a handle for
    /// [`TagState::msg_recv`] (later fragments of a message still arriving follow it there).
    pub fn probe(&mut self, tag: Tag, mask: Tag, remove: bool) -> Option<(RecvInfo, Option<Id>)> {
        let (h, t, msg) = self.unexp.probe(tag, mask)?;
        let info = RecvInfo { length: msg.length(), sender_tag: t };
        if !remove {
            return Some((info, None));
        }
        let (t, msg) = self.unexp.take(h)?;
        let key = match &msg {
            Unexp::Frag { key, data, total, .. } if data.len() < *total => Some(*key),
            _ => None,
        };
        let id = self.probed.insert((t, msg));
        if let Some(k) = key {
            self.frags.insert(k, FragTarget::Probed(id));
        }
        Some((info, Some(id)))
    }

    /// Receives probed message `msg` into `buf`.
    pub fn msg_recv<L: Clone>(
        &mut self,
        sh: &mut Shared<L>,
        buf: UserBuf,
        msg: Id,
        param: RequestParam,
    ) -> UcsResult<RecvOut> {
        let Some((tag, m)) = self.probed.remove(msg) else {
            tracing::error!("tag msg recv: message handle {msg:?} is not a probed message (received already?)");
            return Err(Status::InvalidParam);
        };
        self.recv_matched(sh, buf, tag, m, param)
    }
}
