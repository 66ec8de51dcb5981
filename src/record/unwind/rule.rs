//! How to find a frame's caller, packed into one word so that a cache slot is two words.
//!
//! On x86-64 every frame that compilers emit CFI for is described by three facts at a given
//! instruction: the canonical frame address (CFA) is the stack pointer or the frame pointer
//! plus a constant; the return address is saved at a constant offset from the CFA; the
//! caller's frame pointer is either unchanged or saved at a constant offset from the CFA. A
//! [`Rule`] holds those three facts; everything else DWARF can say (expressions, values kept
//! in other registers, signal frames) is [`Step::Fallback`], and the whole stack is then taken
//! by the `backtrace` crate's unwinder, which understands all of it.

/// What the unwinder does at one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Apply the rule.
    Rule(Rule),
    /// The stack ends here: no unwind information, or the return address is undefined
    /// (`_start`, a thread's entry), where the system unwinder stops too.
    End,
    /// Something this unwinder does not model: let the `backtrace` crate's unwinder take the
    /// whole stack.
    Fallback,
}

/// The caller of a frame, from the frame's registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rule {
    /// The CFA is the frame pointer plus `cfa_offset` (else the stack pointer plus it).
    pub(crate) cfa_from_fp: bool,
    /// Bytes added to the base register to give the CFA.
    pub(crate) cfa_offset: u32,
    /// Bytes below the CFA where the return address is saved.
    pub(crate) ra_below: u16,
    /// Bytes below the CFA where the caller's frame pointer is saved; `None`: unchanged.
    pub(crate) fp_below: Option<u16>,
}

const TAG_RULE: u64 = 1;
const TAG_END: u64 = 2;
const TAG_FALLBACK: u64 = 3;
const FROM_FP: u64 = 1 << 2;
const FP_SAVED: u64 = 1 << 3;
// Bits 8..40: the CFA offset; 40..56: the return address's slot; 56..64: the frame pointer's.

impl Step {
    /// The step as a nonzero word (0 marks an empty cache slot).
    pub(crate) fn encode(self) -> u64 {
        match self {
            Step::End => TAG_END,
            Step::Fallback => TAG_FALLBACK,
            Step::Rule(r) => {
                TAG_RULE
                    | if r.cfa_from_fp { FROM_FP } else { 0 }
                    | if r.fp_below.is_some() { FP_SAVED } else { 0 }
                    | u64::from(r.cfa_offset) << 8
                    | u64::from(r.ra_below) << 40
                    | u64::from(r.fp_below.unwrap_or(0)) << 56
            }
        }
    }

    /// The step a word from [`Step::encode`] stands for.
    #[inline(always)]
    pub(crate) fn decode(word: u64) -> Step {
        match word & 3 {
            TAG_RULE => Step::Rule(Rule {
                cfa_from_fp: word & FROM_FP != 0,
                cfa_offset: (word >> 8) as u32,
                ra_below: (word >> 40) as u16,
                fp_below: (word & FP_SAVED != 0).then_some((word >> 56) as u16),
            }),
            TAG_END => Step::End,
            _ => Step::Fallback,
        }
    }
}

impl Rule {
    /// A rule from DWARF's terms: the CFA register and offset, and the offsets from the CFA at
    /// which the return address and the frame pointer are saved. `None` where a value does
    /// not fit the packed form (no compiler emits such frames; the caller falls back).
    pub(crate) fn new(cfa_from_fp: bool, cfa_offset: i64, ra_at: i64, fp_at: Option<i64>) -> Option<Rule> {
        let below = |at: i64| u16::try_from(at.checked_neg()?).ok().filter(|&b| b > 0);
        // The frame pointer's slot takes the top 8 bits: offsets up to 255 bytes, as every
        // prologue saves it within the first few pushes.
        let fp_below = match fp_at {
            Some(at) => Some(below(at).filter(|&b| b <= 255)?),
            None => None,
        };
        Some(Rule { cfa_from_fp, cfa_offset: u32::try_from(cfa_offset).ok()?, ra_below: below(ra_at)?, fp_below })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_survives_its_encoding() {
        let rules = [
            Rule::new(false, 8, -8, None),
            Rule::new(true, 16, -8, Some(-16)),
            Rule::new(false, 0xffff_ffff, -0xffff, Some(-255)),
            Rule::new(true, 0, -1, Some(-1)),
        ];
        for r in rules {
            let step = Step::Rule(r.expect("fits"));
            assert_ne!(step.encode(), 0);
            assert_eq!(Step::decode(step.encode()), step);
        }
        for step in [Step::End, Step::Fallback] {
            assert_ne!(step.encode(), 0);
            assert_eq!(Step::decode(step.encode()), step);
        }
    }

    #[test]
    fn rules_that_do_not_fit_are_refused() {
        assert_eq!(Rule::new(false, -8, -8, None), None, "a CFA below its base register");
        assert_eq!(Rule::new(false, 1 << 32, -8, None), None);
        assert_eq!(Rule::new(false, 8, 8, None), None, "a return address above the CFA");
        assert_eq!(Rule::new(false, 8, -0x1_0000, None), None);
        assert_eq!(Rule::new(true, 16, -8, Some(-256)), None);
        assert_eq!(Rule::new(true, 16, -8, Some(0)), None);
    }
}
