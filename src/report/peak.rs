//! The most a quantity reached over a history known only by its changes and its value at the
//! end: the peaks `ranks` gives, read in the same pass as the leak finder's.

/// The course of a quantity over a history, from its changes in order: enough to give its peak
/// once its value at the end is known, without keeping the changes.
///
/// The quantity starts at its value at the end less every change, and never goes below 0 (a
/// history that kept only its last entries frees what it never saw allocated): after each
/// change it is `max(0, before + change)`. That running value is, after `t` changes of sums
/// `P_1 .. P_t`, `max(start + P_t, P_t - min(P_1 .. P_t))`, so its peak is the larger of
/// `start + max(0, P_1 .. P_T)` and the largest rise `P_t - P_s` (`s <= t`): three running
/// figures, whatever the start turns out to be.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Course {
    /// The sum of the changes so far.
    total: i128,
    /// The most the sum has been, 0 (before any change) included.
    highest: i128,
    /// The least the sum has been after a change (`None` before the first).
    lowest: Option<i128>,
    /// The most the sum has risen from an earlier low (after a change) to a later sum.
    rise: i128,
}

impl Course {
    /// One change of the quantity, in the history's order.
    #[inline]
    pub(super) fn change(&mut self, by: i128) {
        if by == 0 {
            return;
        }
        self.total += by;
        self.highest = self.highest.max(self.total);
        let lowest = self.lowest.map_or(self.total, |l| l.min(self.total));
        self.lowest = Some(lowest);
        self.rise = self.rise.max(self.total - lowest);
    }

    /// The most the quantity held, now that it is known to hold `end` after the last change.
    pub(super) fn peak(&self, end: u64) -> u64 {
        let start = (i128::from(end) - self.total).max(0);
        let peak = (start + self.highest).max(self.rise).max(start);
        u64::try_from(peak).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::Course;
    use proptest::prelude::*;

    /// The peak the long way: the start worked out from the end, then every change applied
    /// in turn, never below 0.
    fn replayed(changes: &[i128], end: u64) -> u64 {
        let mut now = (i128::from(end) - changes.iter().sum::<i128>()).max(0);
        let mut peak = now;
        for &c in changes {
            now = (now + c).max(0);
            peak = peak.max(now);
        }
        u64::try_from(peak).unwrap_or(u64::MAX)
    }

    fn course(changes: &[i128]) -> Course {
        let mut c = Course::default();
        for &d in changes {
            c.change(d);
        }
        c
    }

    #[test]
    fn a_history_that_frees_more_than_it_started_with_peaks_after_the_floor() {
        // Ends at 100 after -500 then +300: the start works out at 300, the floor holds it at
        // 0 after the free, and the end is 300 (more than the 100 said: the history is torn).
        assert_eq!(replayed(&[-500, 300], 100), 300);
        assert_eq!(course(&[-500, 300]).peak(100), 300);
        // Without the floor the rise from -500 would count from below zero.
        assert_eq!(course(&[-500, 300, 400]).peak(0), 700);
    }

    #[test]
    fn no_changes_peak_at_the_end() {
        assert_eq!(Course::default().peak(42), 42);
        assert_eq!(course(&[0, 0]).peak(7), 7);
    }

    proptest! {
        #[test]
        fn the_course_gives_the_replayed_peak(
            changes in proptest::collection::vec(-1_000i128..1_000, 0..60),
            end in 0u64..3_000,
        ) {
            prop_assert_eq!(course(&changes).peak(end), replayed(&changes, end));
        }

        #[test]
        fn the_course_gives_the_replayed_peak_for_block_sized_changes(
            changes in proptest::collection::vec((any::<bool>(), 0u64..u64::MAX / 4096), 0..40),
            end in any::<u64>(),
        ) {
            let changes: Vec<i128> =
                changes.into_iter().map(|(up, b)| if up { i128::from(b) } else { -i128::from(b) }).collect();
            prop_assert_eq!(course(&changes).peak(end), replayed(&changes, end));
        }
    }
}
