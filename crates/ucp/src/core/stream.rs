//! The driver's half of the stream family: what the API asks (`ucp_stream_*`) entered into the
//! engine's family ([`crate::stream`]), and sends through the shared send path.

use ucs::idtable::Id;
use ucs::UcsResult;

use super::Core;
use crate::dt::UserBuf;
use crate::proto::OpKind;
use crate::request::{RequestParam, SendMsg};
use crate::stream::StreamRecvOut;

impl Core {
    /// Sends `buf` on endpoint `ep_id`'s stream (`ucp_stream_send_nbx`); `Ok(None)`: completed
    /// at once.
    #[inline]
    pub fn stream_send(&self, ep_id: Id, buf: UserBuf, param: RequestParam) -> UcsResult<Option<Id>> {
        self.send_msg(ep_id, buf, SendMsg::Stream, OpKind::Stream, false, param)
    }

    /// Receives from endpoint `ep_id`'s stream into `buf` (`ucp_stream_recv_nbx`).
    pub fn stream_recv(&self, ep_id: Id, buf: UserBuf, waitall: bool, param: RequestParam) -> UcsResult<StreamRecvOut> {
        self.with_engine(|e| e.stream.recv(&mut e.sh, ep_id, buf, waitall, param))
    }

    /// The oldest queued piece of endpoint `ep_id`'s stream, kept until released
    /// (`ucp_stream_recv_data_nb`): its kept entry and where its bytes are.
    pub fn stream_recv_data(&self, ep_id: Id) -> Option<(Id, *const u8, usize)> {
        let c = self.with_engine(|e| e.stream.recv_data(ep_id))?;
        Some(self.keep_chunk(c))
    }

    /// The endpoints whose streams have bytes no poll reported yet (`ucp_stream_worker_poll`).
    pub fn stream_poll(&self, max: usize) -> Vec<Id> {
        self.with_engine(|e| e.stream.poll(max))
    }
}
