//! Sets of seqs as the statements take them: runs of consecutive values, or an
//! `int8multirange` literal.

/// Seqs as runs of consecutive values, `[lo[i], hi[i])`, in order, each seq once.
pub(super) fn seq_runs(seqs: impl Iterator<Item = i64>) -> (Vec<i64>, Vec<i64>) {
    let mut seqs: Vec<i64> = seqs.collect();
    seqs.sort_unstable();
    seqs.dedup();
    let (mut lo, mut hi) = (Vec::new(), Vec::<i64>::new());
    for seq in seqs {
        match hi.last_mut() {
            Some(end) if *end == seq => *end = seq + 1,
            _ => {
                lo.push(seq);
                hi.push(seq + 1);
            }
        }
    }
    (lo, hi)
}

/// Seqs as an `int8multirange` literal: `{[1,4),[7,8)}`.
pub(crate) fn multirange(seqs: &[i64]) -> String {
    let (lo, hi) = seq_runs(seqs.iter().copied());
    let parts: Vec<String> = lo.iter().zip(&hi).map(|(lo, hi)| format!("[{lo},{hi})")).collect();
    format!("{{{}}}", parts.join(","))
}

#[cfg(test)]
mod tests {
    use super::{multirange, seq_runs};

    #[test]
    fn seqs_become_sorted_runs_of_consecutive_values() {
        assert_eq!(multirange(&[1, 2, 3, 5, 7, 8]), "{[1,4),[5,6),[7,9)}");
        assert_eq!(multirange(&[]), "{}");
        assert_eq!(seq_runs([7, 3, 4, 9, 8, 3, 1].into_iter()), (vec![1, 3, 7], vec![2, 5, 10]));
        assert_eq!(seq_runs(std::iter::empty()), (vec![], vec![]));
        assert_eq!(seq_runs([5].into_iter()), (vec![5], vec![6]));
    }
}
