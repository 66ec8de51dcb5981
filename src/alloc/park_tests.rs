//! Unit tests of `park.rs`, beside it rather than in it: that file is also compiled by
//! `tests/park_loom.rs` with loom's atomics, which only run inside a loom model.

use super::ids::{BlockId, StreamId};
use super::park::*;
use super::Pool;
use crate::record::Context;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

fn parked(block: usize, requested: u64) -> Parked {
    Parked {
        block: BlockId::new(block),
        addr: 0x1000 * block as u64,
        requested,
        stream: StreamId(0),
        class: BlockClass { size: requested.next_multiple_of(512), pool: Pool::Small, oversize: false, reusable: true },
    }
}

#[test]
fn a_thread_takes_back_what_it_parked_and_the_pull_gets_the_rest_in_order() {
    let closed = AtomicBool::new(false);
    let mut parking = Parking::default();
    bind(u64::MAX - 1, parking.register());
    assert!(park(u64::MAX - 2, &closed, parked(1, 512), false).is_err(), "no slot for another allocator");
    for (b, r) in [(1, 512), (2, 1024), (3, 512), (4, 4096)] {
        park(u64::MAX - 1, &closed, parked(b, r), false).unwrap();
    }
    assert_eq!(
        take(u64::MAX - 1, StreamId(0), 4096, Recording::Off),
        Took::Block(parked(4, 4096)),
        "the block freed last"
    );
    assert_eq!(take(u64::MAX - 1, StreamId(0), 512, Recording::Off), Took::No, "only the block freed last");
    park(u64::MAX - 1, &closed, parked(4, 4096), false).unwrap();
    assert_eq!(park(u64::MAX - 1, &closed, parked(5, 512), false), Err(Unparked::No), "full");
    assert_eq!(
        take(u64::MAX - 1, StreamId(0), 4096, Recording::Off),
        Took::No,
        "block 5, freed through the lock, was last"
    );
    park(u64::MAX - 1, &closed, parked(3, 512), false).unwrap_err();
    let mut freed = Vec::new();
    assert_eq!(
        parking
            .pull(|p| if let Pulled::Free(b) = p {
                freed.push(b.index())
            })
            .pools[0],
        [1, 4096, 4096]
    );
    assert_eq!(freed, [1, 2, 3, 4], "in parking order");
    park(u64::MAX - 1, &closed, parked(3, 512), false).unwrap();
    assert_eq!(take(u64::MAX - 1, StreamId(1), 512, Recording::Off), Took::No, "another stream");
    assert_eq!(take(u64::MAX - 1, StreamId(0), 513, Recording::Off), Took::No, "another size");
    assert_eq!(take(u64::MAX - 1, StreamId(0), 512, Recording::Off), Took::Block(parked(3, 512)));
    let mut odd = parked(6, 2048);
    odd.class.reusable = false;
    park(u64::MAX - 1, &closed, odd, false).unwrap();
    assert_eq!(
        take(u64::MAX - 1, StreamId(0), 2048, Recording::Off),
        Took::No,
        "a block larger than its rounded request"
    );
    let mut freed = Vec::new();
    let trips = parking.pull(|p| {
        if let Pulled::Free(b) = p {
            freed.push(b.index())
        }
    });
    assert_eq!(freed, [6]);
    assert_eq!(trips.pools[0], [1, 512, 512]);
    assert_eq!(parking.pull(|p| assert_eq!(p, Pulled::Settle)), Trips::default(), "merged once");
    assert_eq!(take(u64::MAX - 1, StreamId(0), 1024, Recording::Off), Took::No, "pulled");
    // Pulled entries are free again.
    for b in 7..11 {
        park(u64::MAX - 1, &closed, parked(b, 512), false).unwrap();
    }
    closed.store(true, SeqCst);
    assert!(park(u64::MAX - 1, &closed, parked(11, 512), false).is_err(), "full anyway");
    parking.pull(|_| {});
    assert_eq!(park(u64::MAX - 1, &closed, parked(12, 512), false), Err(Unparked::No), "closed");
    assert_eq!(parking.pull(|p| assert_eq!(p, Pulled::Settle, "taken back by the parker")), Trips::default());
}

#[test]
fn a_thread_whose_requests_never_match_stops_parking_until_one_would() {
    let (closed, mut parking, id) = (AtomicBool::new(false), Parking::default(), u64::MAX - 6);
    bind(id, parking.register());
    for k in 0..CREDIT as usize {
        park(id, &closed, parked(1 + k % 3, 512 * (1 + k as u64)), false).unwrap();
        assert_eq!(take(id, StreamId(0), 1, Recording::Off), Took::No);
        parking.pull(|_| {});
    }
    assert!(park(id, &closed, parked(1, 512), false).is_err(), "no credit left");
    assert_eq!(take(id, StreamId(0), 512, Recording::Off), Took::No, "not parked: the heap hands it out");
    park(id, &closed, parked(2, 1024), false).unwrap();
    assert_eq!(
        take(id, StreamId(0), 1024, Recording::Off),
        Took::Block(parked(2, 1024)),
        "a request would have matched"
    );
}

/// While recording, each park and take logs an event; a full log refuses both (the caller
/// goes through the lock) until a pull drains it, in order, with each taken block's context.
#[test]
fn a_full_log_refuses_until_the_pull_drains_it() {
    let (closed, mut parking, id) = (AtomicBool::new(false), Parking::default(), u64::MAX - 7);
    bind(id, parking.register());
    remember_site(id, (1, 2, 3), 9);
    let site = Recording::Site((1, 2, 3), 5);
    let mut round_trips = 0;
    let full = loop {
        match park(id, &closed, parked(1, 512), true) {
            Ok(()) => {}
            Err(u) => break u,
        }
        assert_eq!(take(id, StreamId(0), 512, Recording::Site((1, 2, 4), 5)), Took::No, "another site");
        match take(id, StreamId(0), 512, site) {
            Took::Block(p) => assert_eq!(p, parked(1, 512)),
            other => panic!("{other:?}"),
        }
        round_trips += 1;
    };
    assert_eq!(full, Unparked::LogFull);
    assert_eq!(round_trips, LOG / 2);
    assert!(!wait_for_room(id, 2), "nobody pulls");
    let mut events = Vec::new();
    parking.pull(|p| {
        if let Pulled::Logged(e) = p {
            events.push(e)
        }
    });
    assert_eq!(events.len(), LOG);
    assert!(events.windows(2).all(|w| w[0].ticks <= w[1].ticks));
    for (k, e) in events.iter().enumerate() {
        let ctx = (k % 2 == 1).then_some(Context { site: 9, step: 5 });
        assert_eq!((e.block, e.alloc), (BlockId::new(1), ctx), "event {k}");
    }
    assert!(wait_for_room(id, 2), "drained");
    park(id, &closed, parked(1, 512), true).unwrap();
}

#[test]
fn slots_of_gone_threads_and_allocators_go() {
    let mut parking = Parking::default();
    let closed = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            bind(u64::MAX - 3, parking.register());
            park(u64::MAX - 3, &closed, parked(1, 512), false).unwrap();
        });
    });
    let mut freed = Vec::new();
    parking.pull(|p| {
        if let Pulled::Free(b) = p {
            freed.push(b.index())
        }
    });
    assert_eq!(freed, [1]);
    // The thread's locals (its binding) may be destroyed a moment after the scope ends.
    for _ in 0..1000 {
        if parking.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        parking.pull(|p| assert_eq!(p, Pulled::Settle));
    }
    assert!(parking.is_empty(), "the gone thread's slot is dropped");
    // The thread's binding for an allocator whose list went is dropped at its next bind.
    bind(u64::MAX - 4, Parking::default().register());
    assert!(is_bound(u64::MAX - 4));
    bind(u64::MAX - 5, parking.register());
    assert!(!is_bound(u64::MAX - 4), "its allocator's list is gone");
    assert!(is_bound(u64::MAX - 5));
}
