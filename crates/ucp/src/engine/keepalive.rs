//! Keepalive (`UCX_KEEPALIVE_INTERVAL`, `UCX_KEEPALIVE_NUM_EPS`): every interval, up to a
//! number of connected endpoints, round robin, have their peers checked; a dead one fails its
//! endpoint. The engine decides which and when, on the time it is given; the driver asks the
//! transports.

use ucs::idtable::Id;

use super::{Action, EpStatus, Shared};

/// Keepalive rounds.
#[derive(Debug)]
pub(crate) struct Keepalive {
    /// Interval in ns (0: off).
    interval: u64,
    /// Endpoints per round.
    per_round: usize,
    /// When the next round is due.
    due: u64,
    /// Where the next round starts.
    cursor: usize,
}

impl Keepalive {
    /// Rounds every `interval` ns (0: none) over up to `per_round` endpoints, the first one an
    /// interval after `now`.
    pub fn new(interval: u64, per_round: usize, now: u64) -> Keepalive {
        Keepalive { interval, per_round: per_round.max(1), due: now.saturating_add(interval), cursor: 0 }
    }

    /// When the next round is due; `None` without keepalive.
    #[inline]
    pub fn next_timeout(&self) -> Option<u64> {
        (self.interval != 0).then_some(self.due)
    }

    /// Makes the next timer event run a round (the wakeup timer fired).
    pub fn force(&mut self) {
        self.due = 0;
    }
}

impl<L: Clone> Shared<L> {
    /// Time passed to `now`: runs a keepalive round if one is due.
    pub fn on_timer(&mut self, now: u64) {
        let k = &mut self.keepalive;
        if k.interval == 0 || now < k.due {
            return;
        }
        k.due = now.saturating_add(k.interval);
        let ids: Vec<Id> = self.eps.iter().filter(|(_, e)| e.status == EpStatus::Connected).map(|(id, _)| id).collect();
        if ids.is_empty() {
            return;
        }
        let k = &mut self.keepalive;
        let start = k.cursor % ids.len();
        let count = k.per_round.min(ids.len());
        k.cursor = start + count;
        for &id in ids.iter().cycle().skip(start).take(count) {
            self.push(Action::CheckPeer(id));
        }
    }
}
