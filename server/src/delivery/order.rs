//! The order a stream sends in (guarantee 6: per stream, in `seq` order). A relay pass that
//! holds the stream's lend may have leased it lower seqs than a lease the stream makes
//! meanwhile; those come with the pass's hand-over. So what the stream leases while a pass
//! holds its lend waits here, staged, until that pass has handed over, and then everything goes
//! out in seq order. The stream never waits for the pass: it goes on serving acks and pushes.
//!
//! Plain data: no I/O, no clock. The session tells it what it leased and what was handed over;
//! it answers what to send now. Tests drive it directly.
use crate::domain::LeasedDelivery;

#[derive(Debug, Default)]
pub struct Order {
    staged: Vec<LeasedDelivery>,
    /// The number of the pass whose hand-over releases what is staged (see `hub::Handed`).
    until: u64,
    /// The highest pass number whose hand-over this stream has taken: a lease never waits
    /// for a pass that has handed over already.
    handed: u64,
}

impl Order {
    /// Deliveries the stream leased, with the pushes that reached it before the lease
    /// returned; `holder` is the number the pass that holds the lend now will hand over with
    /// (`None` when no pass holds it). Returns what to send now, in seq order.
    pub fn leased(&mut self, mut deliveries: Vec<LeasedDelivery>, holder: Option<u64>) -> Vec<LeasedDelivery> {
        self.staged.append(&mut deliveries);
        // The holder may have handed over between the question and the lease's return: its
        // hand-over was taken (`drained`), so there is nothing left to wait for.
        match holder.filter(|pass| *pass > self.handed) {
            Some(pass) => {
                self.until = self.until.max(pass);
                Vec::new()
            }
            None => self.flush(),
        }
    }

    /// What pass number `pass` handed over (in seq order, as a pass hands over). Returns what
    /// to send now: all of it when nothing is staged, and everything once the pass that the
    /// staged deliveries wait for has handed over.
    pub fn handed(&mut self, pass: u64, deliveries: Vec<LeasedDelivery>) -> Vec<LeasedDelivery> {
        self.handed = self.handed.max(pass);
        if self.staged.is_empty() {
            return deliveries;
        }
        self.staged.extend(deliveries);
        if pass < self.until { Vec::new() } else { self.flush() }
    }

    /// A hand-over taken from the channel while a lease was under way: its deliveries go out
    /// with what that lease returns ([`Order::leased`], called next), and its pass is not
    /// waited for any more.
    pub fn drained(&mut self, pass: u64, mut deliveries: Vec<LeasedDelivery>) {
        self.handed = self.handed.max(pass);
        self.staged.append(&mut deliveries);
    }

    /// What is staged and was never sent (the stream is ending).
    pub fn unsent(&mut self) -> Vec<LeasedDelivery> {
        std::mem::take(&mut self.staged)
    }

    pub fn staged(&self) -> usize {
        self.staged.len()
    }

    fn flush(&mut self) -> Vec<LeasedDelivery> {
        let mut all = std::mem::take(&mut self.staged);
        all.sort_by_key(|d| d.message.seq);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seq: i64) -> LeasedDelivery {
        LeasedDelivery::sample(seq, chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap())
    }

    fn seqs(ds: &[LeasedDelivery]) -> Vec<i64> {
        ds.iter().map(|d| d.message.seq).collect()
    }

    #[test]
    fn with_no_pass_holding_the_lend_a_lease_goes_at_once_merged_with_the_pushes_that_came() {
        let mut o = Order::default();
        assert_eq!(seqs(&o.leased(vec![at(3), at(4), at(1), at(2)], None)), [1, 2, 3, 4]);
        assert_eq!(o.staged(), 0);
        assert_eq!(seqs(&o.handed(1, vec![at(5)])), [5], "a hand-over with nothing staged goes at once");
    }

    #[test]
    fn a_lease_made_while_a_pass_holds_the_lend_waits_for_that_pass_and_no_later_one() {
        // The interleaving CI caught once (ADR 0050): pass 3 pushed seqs 1 and 2 and wrote 3–12
        // pending; the stream leased 3 and 4 before pass 3 handed over.
        let mut o = Order::default();
        assert!(o.leased(vec![at(3), at(4)], Some(3)).is_empty(), "staged");
        // An earlier pass's hand-over arriving late is staged with them.
        assert!(o.handed(2, vec![at(0)]).is_empty());
        assert_eq!(seqs(&o.handed(3, vec![at(1), at(2)])), [0, 1, 2, 3, 4]);
        assert_eq!(o.staged(), 0);
        // A later pass is not waited for.
        assert_eq!(seqs(&o.handed(4, vec![at(20)])), [20]);
    }

    #[test]
    fn a_second_lease_under_a_later_pass_waits_for_the_later_one() {
        let mut o = Order::default();
        assert!(o.leased(vec![at(5)], Some(1)).is_empty());
        assert!(o.leased(vec![at(7)], Some(2)).is_empty());
        assert!(o.handed(1, vec![at(4)]).is_empty(), "pass 2 may hold seq 6");
        assert_eq!(seqs(&o.handed(2, vec![at(6)])), [4, 5, 6, 7]);
    }

    #[test]
    fn a_lease_does_not_wait_for_a_pass_whose_hand_over_it_drained_meanwhile() {
        // The race b488a09 closed: the stream asked pass 2 for word (it held the lend), then
        // took pass 2's hand-over from the channel before the lease returned. Waiting for pass
        // 2 now would wait for a message that has come already, until the leases expired.
        let mut o = Order::default();
        o.drained(2, vec![at(1)]);
        assert_eq!(seqs(&o.leased(vec![at(3), at(2)], Some(2))), [1, 2, 3], "sent at once, in order");
        assert_eq!(o.staged(), 0);
        // A later pass that holds the lend now is still waited for.
        o.drained(3, vec![]);
        assert!(o.leased(vec![at(5)], Some(4)).is_empty());
        assert!(o.handed(3, vec![at(4)]).is_empty(), "an earlier pass does not release it");
        assert_eq!(seqs(&o.handed(4, vec![])), [4, 5]);
        // A plain hand-over counts too.
        assert_eq!(seqs(&o.handed(5, vec![at(6)])), [6]);
        assert_eq!(seqs(&o.leased(vec![at(7)], Some(5))), [7], "pass 5 handed over already");
    }

    #[test]
    fn what_is_staged_when_the_stream_ends_is_unsent() {
        let mut o = Order::default();
        assert!(o.leased(vec![at(9), at(8)], Some(1)).is_empty());
        assert_eq!(seqs(&o.unsent()), [9, 8]);
        assert_eq!(o.staged(), 0);
    }
}
