//! `PsTable` in memory: values created, optimizers applied, formats, creation, admission and
//! eviction policies, bulk load and export, metrics and hot ids, and calls from several
//! threads, also while the index grows. Counts and values only, no timings.

use starwire::rows::ps::{
    Consistency, Create, Float, Init, Optimizer, PsTable, PsTableBuilder, RowsError,
};
use starwire::rows::MemTable;
use starwire::{DType, Status, Table};

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn pull(t: &PsTable, ids: &[u64]) -> (Vec<f32>, Vec<u32>) {
    let mut out = vec![0xffu8; ids.len() * t.row_bytes()];
    let mut missing = Vec::new();
    assert_eq!(t.pull(ids, &mut out, &mut missing), Status::Ok);
    (floats(&out), missing)
}

fn table(b: PsTableBuilder) -> PsTable {
    b.huge_pages(false).build().expect("table")
}

#[test]
fn initial_values_are_a_function_of_table_id_and_seed() {
    let init = Init::Uniform {
        scale: 0.1,
        seed: 42,
    };
    let a = table(PsTable::builder(8).table_id(3).init(init));
    let b = table(PsTable::builder(8).table_id(3).init(init));
    let ids: Vec<u64> = (0..500).map(|i| i * 7919 + 1).collect();
    let rev: Vec<u64> = ids.iter().rev().copied().collect();
    let (ra, _) = pull(&a, &ids);
    let (rb, _) = pull(&b, &rev);
    for (i, &id) in ids.iter().enumerate() {
        let j = ids.len() - 1 - i;
        assert_eq!(ra[i * 8..][..8], rb[j * 8..][..8], "id {id}");
        for k in 0..8 {
            assert_eq!(ra[i * 8 + k], init.value(3, id, k));
        }
    }
    assert!(ra.iter().all(|v| v.abs() <= 0.1));
    // Another table number, other rows; table 0 is MemTable's uniform.
    let c = table(PsTable::builder(8).table_id(4).init(init));
    assert_ne!(pull(&c, &ids).0, ra);
    let zero = table(PsTable::builder(8).init(init));
    let old = MemTable::new(
        8,
        starwire::rows::Init::Uniform {
            scale: 0.1,
            seed: 42,
        },
        starwire::rows::Optimizer::Sgd { lr: 1.0 },
    );
    let mut want = vec![0u8; ids.len() * 32];
    let mut missing = Vec::new();
    assert_eq!(old.pull(&ids, &mut want, &mut missing), Status::Ok);
    assert_eq!(pull(&zero, &ids).0, floats(&want));

    // Normal values: the same in two tables, mean and spread as asked.
    let normal = Init::Normal { std: 0.5, seed: 9 };
    let n1 = table(PsTable::builder(16).init(normal));
    let n2 = table(PsTable::builder(16).init(normal));
    let many: Vec<u64> = (0..2000).collect();
    let (v1, _) = pull(&n1, &many);
    assert_eq!(v1, pull(&n2, &many).0);
    let mean = v1.iter().map(|&v| f64::from(v)).sum::<f64>() / v1.len() as f64;
    let sd = (v1
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / v1.len() as f64)
        .sqrt();
    assert!(mean.abs() < 0.02 && (sd - 0.5).abs() < 0.02, "{mean} {sd}");
}

#[test]
fn optimizers_by_hand_through_the_table() {
    // SGD.
    let t = table(PsTable::builder(2).optimizer(Optimizer::Sgd { lr: 0.1 }));
    assert_eq!(t.push(&[1, 1], &bytes(&[1.0, -2.0, 3.0, 0.5])), Status::Ok);
    assert_eq!(
        t.get(1),
        Some(vec![-0.1f32 * 1.0 - 0.1 * 3.0, 0.1f32 * 2.0 - 0.1 * 0.5])
    );
    assert_eq!(t.state(1), Some(vec![]));

    // Adagrad, as MemTable computes it.
    let adagrad = Optimizer::Adagrad {
        lr: 0.5,
        initial_accumulator: 1.0,
    };
    let t = table(PsTable::builder(2).optimizer(adagrad));
    t.push(&[9], &bytes(&[3.0, 0.0]));
    t.push(&[9], &bytes(&[-4.0, 2.0]));
    let w0 = -0.5f32 * 3.0 / 10f32.sqrt() - 0.5 * -4.0 / 26f32.sqrt();
    let w1 = -0.5f32 * 2.0 / 5f32.sqrt();
    assert_eq!(t.get(9), Some(vec![w0, w1]));
    assert_eq!(t.state(9), Some(vec![26.0, 5.0]));
    let old = MemTable::new(
        2,
        starwire::rows::Init::Zeros,
        starwire::rows::Optimizer::Adagrad {
            lr: 0.5,
            initial_accumulator: 1.0,
        },
    );
    old.push(&[9], &bytes(&[3.0, 0.0]));
    old.push(&[9], &bytes(&[-4.0, 2.0]));
    assert_eq!(old.get(9), t.get(9));

    // Adam, one element, two steps.
    let t = table(PsTable::builder(1).optimizer(Optimizer::Adam {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.99,
        epsilon: 1e-8,
    }));
    let (g1, g2) = (2.0f32, -1.0f32);
    t.push(&[5], &bytes(&[g1]));
    t.push(&[5], &bytes(&[g2]));
    let (mut m, mut v, mut w) = (0f32, 0f32, 0f32);
    let (mut p1, mut p2) = (1f32, 1f32);
    for g in [g1, g2] {
        p1 *= 0.9;
        p2 *= 0.99;
        m = 0.9 * m + (1.0 - 0.9) * g;
        v = 0.99 * v + (1.0 - 0.99) * g * g;
        w -= 0.1 * (m / (1.0 - p1)) / ((v / (1.0 - p2)).sqrt() + 1e-8);
    }
    assert_eq!(t.get(5), Some(vec![w]));
    assert_eq!(t.state(5), Some(vec![p1, p2, m, v]));
}

#[test]
fn half_precision_storage() {
    // Stored as bf16, served as f32: values rounded to bf16 on every update.
    let t = table(
        PsTable::builder(3)
            .stored_as(Float::Bf16)
            .optimizer(Optimizer::Sgd { lr: 1.0 }),
    );
    assert_eq!(t.dtype(), DType::F32);
    t.push(&[1], &bytes(&[-1.0, -1.0 / 3.0, 1000.5]));
    let (rows, _) = pull(&t, &[1]);
    // 1/3 in bf16 is 0.333984375; 1000.5 rounds to 1000 (8 bits of mantissa).
    assert_eq!(rows, [1.0, 0.333_984_38, -1000.0]);

    // Served as stored: the pull is a copy of the bf16 bytes; gradients come as bf16.
    let t = table(
        PsTable::builder(4)
            .stored_as(Float::F16)
            .served_as(Float::F16)
            .optimizer(Optimizer::Sgd { lr: 1.0 }),
    );
    assert_eq!((t.dtype(), t.row_bytes()), (DType::F16, 8));
    // The f16 bits of 0.5, 0.25, -2 and 0 (all exact); the gradient is their negation,
    // so with lr 1 the row becomes them.
    let want: Vec<u8> = [0x3800u16, 0x3400, 0xc000, 0x0000]
        .iter()
        .flat_map(|h| h.to_le_bytes())
        .collect();
    let grads: Vec<u8> = [0x3800u16, 0x3400, 0xc000, 0x0000]
        .iter()
        .flat_map(|h| (h ^ 0x8000).to_le_bytes())
        .collect();
    assert_eq!(t.push(&[2], &grads), Status::Ok);
    let mut out = [0u8; 8];
    let mut missing = Vec::new();
    t.pull(&[2], &mut out, &mut missing);
    assert_eq!(out[..], want[..]);
    assert_eq!(t.get(2), Some(vec![0.5, 0.25, -2.0, 0.0]));
    // Half the memory of the rows (beside the id and the version).
    assert_eq!(t.report().slot_bytes, 8 + 8 + 8);
}

#[test]
fn which_calls_create_rows() {
    let on_push = table(PsTable::builder(2).create(Create::OnPush));
    let (rows, missing) = pull(&on_push, &[3, 4]);
    assert_eq!((rows, missing), (vec![0.0; 4], vec![0, 1]));
    assert!(on_push.is_empty());
    on_push.push(&[4], &bytes(&[1.0, 1.0]));
    assert_eq!(pull(&on_push, &[3, 4]).1, [0]);
    let m = on_push.metrics();
    assert_eq!((m.rows, m.created, m.missing, m.pulled_rows), (1, 1, 3, 4));

    let never = table(PsTable::builder(2).create(Create::Never));
    never.push(&[1, 2], &bytes(&[1.0; 4]));
    assert!(never.is_empty());
    assert_eq!(never.metrics().dropped_pushes, 2);
    never
        .load_rows(&[1], &[5.0, 6.0], None)
        .expect("loads create rows whatever the setting");
    assert_eq!(pull(&never, &[1, 2]), (vec![5.0, 6.0, 0.0, 0.0], vec![1]));
}

#[test]
fn admission_after_n_sightings() {
    let t = table(PsTable::builder(2).admit_after(3));
    // Sightings 1 and 2 of id 7: missing, not created; the 3rd creates it.
    assert_eq!(pull(&t, &[7]).1, [0]);
    t.push(&[7], &bytes(&[1.0, 1.0]));
    assert!(t.is_empty());
    assert!(pull(&t, &[7]).1.is_empty());
    assert_eq!(t.len(), 1);
    let m = t.metrics();
    assert_eq!(
        (m.not_admitted, m.created, m.dropped_pushes, m.missing),
        (2, 1, 1, 1)
    );
    // Ids seen once stay out.
    let once: Vec<u64> = (100..1100).collect();
    pull(&t, &once);
    assert_eq!(t.len(), 1);
    assert_eq!(t.metrics().not_admitted, 1002);
}

#[test]
fn eviction_of_untouched_rows() {
    let init = Init::Uniform {
        scale: 1.0,
        seed: 1,
    };
    let t = table(
        PsTable::builder(2)
            .init(init)
            .optimizer(Optimizer::Sgd { lr: 1.0 })
            .evict_untouched(2),
    );
    let old: Vec<u64> = (0..100).collect();
    let young: Vec<u64> = (100..150).collect();
    pull(&t, &old);
    t.push(&[5], &bytes(&[10.0, 10.0]));
    t.advance_clock();
    t.advance_clock();
    pull(&t, &young);
    // Ages: old rows 2 ticks (not over 2), young 0.
    assert_eq!(t.maintain().evicted_untouched, 0);
    t.advance_clock();
    let report = t.maintain();
    assert_eq!(report.evicted_untouched, 100);
    assert_eq!(t.len(), 50);
    assert_eq!(t.metrics().evicted_untouched, 100);
    assert_eq!(t.get(5), None);
    // A re-created row has its initial values again (the push before eviction is gone).
    assert_eq!(pull(&t, &[5]).0, [init.value(0, 5, 0), init.value(0, 5, 1)]);
    // The slots come back into use after a grace period: later maintains free them.
    let mut reused = report.slots_reused;
    for _ in 0..3 {
        reused += t.maintain().slots_reused;
    }
    assert_eq!(reused, 100);
    let before = t.metrics().memory_bytes;
    let more: Vec<u64> = (1000..1099).collect();
    pull(&t, &more);
    // 99 new rows fit in the freed slots: no slot beyond the ones handed out before.
    assert_eq!(t.metrics().memory_bytes, before);
}

#[test]
fn eviction_over_the_row_cap() {
    let t = table(PsTable::builder(4).max_rows(1000));
    let first: Vec<u64> = (0..600).collect();
    let second: Vec<u64> = (600..1000).collect();
    pull(&t, &first);
    t.advance_clock();
    pull(&t, &second);
    // At the cap: new rows are refused, counted.
    let (_, missing) = pull(&t, &[5000, 5001]);
    assert_eq!(missing, [0, 1]);
    assert_eq!(t.metrics().refused, 2);
    // Over 95 % of the cap: the least recently touched go, down to 90 %.
    let report = t.maintain();
    assert_eq!(report.evicted_over_cap, 100);
    assert_eq!(t.len(), 900);
    assert_eq!(t.metrics().evicted_over_cap, 100);
    // The 100 evicted are among the older 600; the newer 400 all stay.
    let mut kept_old = 0;
    t.for_each_row(|id, _, _| kept_old += u64::from(id < 600));
    assert_eq!(kept_old, 500);
    assert!(second.iter().all(|&id| t.get(id).is_some()));
    // Under 95 %: nothing to do.
    assert_eq!(t.maintain().evicted_over_cap, 0);
}

#[test]
fn bulk_load_and_export_round_trip() {
    let opt = Optimizer::adam(0.01);
    let t = table(PsTable::builder(3).optimizer(opt));
    assert_eq!(t.state_len(), 8);
    let ids = [10u64, 20, 30];
    let values: Vec<f32> = (0..9).map(|i| i as f32 * 0.5).collect();
    let state: Vec<f32> = (0..24).map(|i| i as f32 + 0.25).collect();
    let r = t.load_rows(&ids, &values, Some(&state)).unwrap();
    assert_eq!((r.created, r.overwritten), (3, 0));
    // Overwrite one row's values, keep its state.
    let r = t.load_rows(&[20], &[7.0, 8.0, 9.0], None).unwrap();
    assert_eq!((r.created, r.overwritten), (0, 1));

    let mut out = vec![0f32; 12];
    let mut st = vec![0f32; 32];
    let mut missing = Vec::new();
    t.export_rows(&[30, 20, 99, 10], &mut out, Some(&mut st), &mut missing)
        .unwrap();
    assert_eq!(missing, [2]);
    assert_eq!(out[..3], values[6..9]);
    assert_eq!(out[3..6], [7.0, 8.0, 9.0]);
    assert_eq!(out[6..9], [0.0; 3]);
    assert_eq!(out[9..12], values[0..3]);
    assert_eq!(st[..8], state[16..24]);
    assert_eq!(st[8..16], state[8..16]);
    assert_eq!(st[24..32], state[0..8]);
    assert_eq!(t.metrics().loaded, 4);

    // Every row, in some order.
    let mut seen = Vec::new();
    t.for_each_row(|id, v, s| seen.push((id, v.to_vec(), s.len())));
    seen.sort_by_key(|e| e.0);
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[1], (20, vec![7.0, 8.0, 9.0], 8));

    // Lengths are checked before anything is done.
    assert_eq!(
        t.load_rows(&[1], &[1.0], None),
        Err(RowsError::Length {
            what: "values",
            expected: 3,
            got: 1
        })
    );
    assert!(t.load_rows(&[1], &[1.0; 3], Some(&[0.0; 7])).is_err());
    assert_eq!(t.len(), 3);
    // A load beyond the cap loads what fits.
    let capped = table(PsTable::builder(1).max_rows(2));
    assert_eq!(
        capped.load_rows(&[1, 2, 3], &[1.0, 2.0, 3.0], None),
        Err(RowsError::Refused { loaded: 2 })
    );
}

#[test]
fn metrics_and_hot_ids() {
    let t = table(PsTable::builder(16).hot_sample_every(1).capacity(10_000));
    let report = t.report();
    assert_eq!((report.slot_bytes, report.data_bytes_per_row), (80, 64));
    // Ids 1 and 2 in every call, 4,000 others once each.
    for call in 0..40u64 {
        let mut ids: Vec<u64> = (0..100).map(|i| 1000 + call * 100 + i).collect();
        ids[10] = 1;
        ids[50] = 2;
        ids[70] = 1;
        pull(&t, &ids);
    }
    let m = t.metrics();
    assert_eq!((m.pulls, m.pulled_rows, m.rows), (40, 4000, 3882));
    assert_eq!(m.data_bytes, 3882 * 64);
    assert!(m.memory_bytes >= m.data_bytes && m.committed_bytes >= m.memory_bytes);
    assert_eq!(m.hot_sample_every, 1);
    assert_eq!(m.hot[0].id, 1);
    assert_eq!(m.hot[1].id, 2);
    assert!(m.hot[0].sampled > m.hot[1].sampled);
    assert_eq!(t.hot_ids(2).len(), 2);
    // Off: none.
    let off = table(PsTable::builder(4).hot_sample_every(0));
    pull(&off, &[1, 1, 1]);
    assert!(off.metrics().hot.is_empty());
}

#[test]
fn wrong_lengths_are_invalid_argument() {
    let t = table(PsTable::builder(2));
    let mut missing = Vec::new();
    assert_eq!(
        t.pull(&[1, 2], &mut [0u8; 15], &mut missing),
        Status::InvalidArgument
    );
    assert_eq!(t.push(&[1], &[0u8; 9]), Status::InvalidArgument);
    assert_eq!(t.pull(&[], &mut [], &mut missing), Status::Ok);
    assert_eq!(t.push(&[], &[]), Status::Ok);
    assert!(t.is_empty() && missing.is_empty());
    assert!(PsTable::builder(0).build().is_err());
}

/// Threads push and pull rows of their own (disjoint ids) with SGD: under Hogwild too,
/// every update of a row is its thread's, so the sums are exact.
#[test]
fn threads_on_disjoint_rows_are_exact() {
    const THREADS: u64 = 4;
    const IDS: u64 = 3000;
    const ROUNDS: usize = 20;
    let t = table(PsTable::builder(3).optimizer(Optimizer::Sgd { lr: 0.5 }));
    std::thread::scope(|s| {
        for th in 0..THREADS {
            let t = &t;
            s.spawn(move || {
                let ids: Vec<u64> = (0..IDS).filter(|i| i % THREADS == th).collect();
                let grads = bytes(&[1.0, 2.0, -1.0].repeat(50));
                let mut out = vec![0u8; 50 * 12];
                let mut missing = Vec::new();
                for _ in 0..ROUNDS {
                    for batch in ids.chunks(50) {
                        let g = &grads[..batch.len() * 12];
                        assert_eq!(t.push(batch, g), Status::Ok);
                        let o = &mut out[..batch.len() * 12];
                        assert_eq!(t.pull(batch, o, &mut missing), Status::Ok);
                    }
                }
                assert!(missing.is_empty());
            });
        }
    });
    assert_eq!(t.len(), IDS);
    let steps = ROUNDS as f32;
    for id in 0..IDS {
        assert_eq!(
            t.get(id),
            Some(vec![-0.5 * steps, -steps, 0.5 * steps]),
            "{id}"
        );
    }
}

/// With `Consistency::PerRow`, threads pushing the same rows lose no update, and a pull
/// sees a row as some push left it (here: all its elements equal).
#[test]
fn per_row_consistency_loses_no_update() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 300;
    let t = table(
        PsTable::builder(8)
            .consistency(Consistency::PerRow)
            .row_locks(4)
            .optimizer(Optimizer::Sgd { lr: 1.0 }),
    );
    let ids: Vec<u64> = (0..64).collect();
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            let (t, ids) = (&t, &ids);
            s.spawn(move || {
                let grads = bytes(&vec![-1.0; 8 * ids.len()]);
                let mut out = vec![0u8; 32 * ids.len()];
                let mut missing = Vec::new();
                for _ in 0..ROUNDS {
                    assert_eq!(t.push(ids, &grads), Status::Ok);
                    assert_eq!(t.pull(ids, &mut out, &mut missing), Status::Ok);
                    for row in floats(&out).chunks(8) {
                        assert!(row.iter().all(|&v| v == row[0]), "torn row {row:?}");
                    }
                }
            });
        }
    });
    let total = (THREADS * ROUNDS) as f32;
    for &id in &ids {
        assert_eq!(t.get(id), Some(vec![total; 8]), "{id}");
    }
}

/// One call that creates many rows keeps the index growing as it goes: none refused.
#[test]
fn one_call_creating_many_rows() {
    let t = table(PsTable::builder(2));
    let ids: Vec<u64> = (0..100_000).map(|i| i * 3).collect();
    let (_, missing) = pull(&t, &ids);
    assert!(missing.is_empty());
    let m = t.metrics();
    assert_eq!((m.rows, m.created, m.refused), (100_000, 100_000, 0));
    assert!(m.index_builds >= 4);
    let values = vec![1.0f32; 2 * ids.len()];
    let other: Vec<u64> = ids.iter().map(|i| i + 1).collect();
    let fresh = table(PsTable::builder(2));
    assert_eq!(
        fresh.load_rows(&other, &values, None).unwrap().created,
        100_000
    );
}

/// Rows created from one thread make the index grow (several builds) while other threads
/// push and pull their own rows: nothing is lost, every value exact.
#[test]
fn growth_while_pulling_and_pushing() {
    let t = table(PsTable::builder(4).optimizer(Optimizer::Sgd { lr: 1.0 }));
    const NEW: u64 = 200_000;
    std::thread::scope(|s| {
        let t = &t;
        s.spawn(move || {
            let ids: Vec<u64> = (1_000_000..1_000_000 + NEW).collect();
            for batch in ids.chunks(1000) {
                assert!(pull(t, batch).1.is_empty());
            }
        });
        for th in 0..2u64 {
            s.spawn(move || {
                let ids: Vec<u64> = (0..500).map(|i| i * 2 + th).collect();
                let grads = bytes(&vec![-1.0; 4 * ids.len()]);
                for round in 1..=200 {
                    assert_eq!(t.push(&ids, &grads), Status::Ok);
                    let (rows, missing) = pull(t, &ids);
                    assert!(missing.is_empty());
                    assert!(rows.iter().all(|&v| v == round as f32), "round {round}");
                }
            });
        }
    });
    let m = t.metrics();
    assert!(m.index_builds >= 5, "{}", m.index_builds);
    assert_eq!((m.rows, m.refused), (NEW + 1000, 0));
    for id in (1_000_000..1_000_000 + NEW).step_by(97) {
        assert_eq!(t.get(id), Some(vec![0.0; 4]));
    }
    for id in 0..1000 {
        assert_eq!(t.get(id), Some(vec![200.0; 4]));
    }
    // The memory of the levels grown out of is given back once nothing can see it.
    for _ in 0..4 {
        t.maintain();
    }
    let (m, slot) = (t.metrics(), t.report().slot_bytes as u64);
    assert!(
        m.memory_bytes < m.rows * (slot + 24),
        "{} bytes for {} rows of {slot}-byte slots",
        m.memory_bytes,
        m.rows
    );
}
