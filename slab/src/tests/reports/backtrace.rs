use crate::reports::backtrace::{FrameBounds, MAX_WALK_FRAMES, backtrace_from};

const TEXT: core::ops::Range<usize> = 0x1000..0x2000;

/// A fake stack of frame records: `frames[i]` = (next frame's index or
/// None, return address).
fn stack(records: &[(Option<usize>, usize)]) -> std::vec::Vec<usize> {
    let mut words = std::vec![0usize; records.len() * 2];
    let base = words.as_ptr() as usize;
    for (index, (next, ret)) in records.iter().enumerate() {
        words[index * 2] = next.map_or(0, |next| base + next * 16);
        words[index * 2 + 1] = *ret;
    }
    words
}

fn walk(words: &[usize], start: usize, out: &mut [usize]) -> usize {
    let base = words.as_ptr() as usize;
    let bounds = FrameBounds {
        stack: base..base + words.len() * 8,
        text: TEXT,
    };
    // SAFETY: `words` is readable for the call.
    unsafe { backtrace_from(base + start * 16, &bounds, out) }
}

#[test]
fn walks_the_chain_outward() {
    let words = stack(&[(Some(1), 0x1100), (Some(2), 0x1200), (None, 0x1300)]);
    let mut out = [0; 8];
    assert_eq!(walk(&words, 0, &mut out), 3);
    assert_eq!(&out[..3], &[0x1100, 0x1200, 0x1300]);
    // Bounded by the output.
    let mut two = [0; 2];
    assert_eq!(walk(&words, 0, &mut two), 2);
}

#[test]
fn stops_at_text_stack_and_order_violations() {
    // A return address outside text ends the walk before it.
    let words = stack(&[(Some(1), 0x1100), (Some(2), 0x9999), (None, 0x1300)]);
    let mut out = [0; 8];
    assert_eq!(walk(&words, 0, &mut out), 1);
    // A frame pointer going inward (a loop) ends the walk.
    let words = stack(&[(Some(1), 0x1100), (Some(0), 0x1200)]);
    assert_eq!(walk(&words, 0, &mut out), 2);
    // A frame pointer out of the stack is not followed (nor read).
    let mut words = stack(&[(Some(1), 0x1100), (None, 0x1200)]);
    words[0] = 0xdead_0000;
    assert_eq!(walk(&words, 0, &mut out), 1);
    // Unaligned.
    words[0] = words.as_ptr() as usize + 17;
    assert_eq!(walk(&words, 0, &mut out), 1);
    // Never more than MAX_WALK_FRAMES, however long the chain.
    let records: std::vec::Vec<_> = (0..MAX_WALK_FRAMES + 10)
        .map(|index| (Some(index + 1), 0x1100))
        .collect();
    let words = stack(&records);
    let mut out = [0; MAX_WALK_FRAMES + 10];
    assert_eq!(walk(&words, 0, &mut out), MAX_WALK_FRAMES);
}
