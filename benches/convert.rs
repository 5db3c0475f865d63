//! Rows in another float format: what converting them costs, per 64-dim row, on one thread.
//!
//! Each figure is one end's conversion of a block of 1,000 rows of 64 elements (what one
//! table of a rows request carries), block in and out in cache (256 KiB of f32 in, the
//! last-level cache is larger), the median of 11 runs of 200 blocks each. A copy of the
//! same bytes is measured beside it: what a row costs to move at all. The kernels are the
//! library's (`float::convert`): AVX2 where the CPU has it, else the baseline build.
//!
//! `cargo bench --bench convert`; `-- --rows N` for another block size.

use std::hint::black_box;
use std::time::Instant;

use starwire::float::{self, Float};

mod common;
use common::*;

const DIM: usize = 64;
const RUNS: usize = 11;
const BLOCKS: usize = 200;

/// Nanoseconds per row of `f`, run on blocks of `rows` rows: the median of `RUNS` runs.
fn per_row(rows: usize, mut f: impl FnMut()) -> f64 {
    // A warm-up: pages touched, caches filled, the clock up to speed.
    for _ in 0..BLOCKS {
        f();
    }
    let mut v = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t = Instant::now();
        for _ in 0..BLOCKS {
            f();
        }
        v.push(t.elapsed().as_nanos() as f64 / (BLOCKS * rows) as f64);
    }
    median(v)
}

fn main() {
    let args = bench_args();
    let rows = args
        .iter()
        .position(|a| a == "--rows")
        .and_then(|i| args.get(i + 1))
        .map_or(1000, |n| n.parse().expect("--rows N"));
    let cpus = allowed_cpus();
    restrict_to(cpus[0]);
    let avx2 = std::is_x86_feature_detected!("avx2");
    println!(
        "# rows conversion, one thread pinned to CPU {}: blocks of {rows} rows x {DIM} \
         elements, median of {RUNS} runs of {BLOCKS} blocks; AVX2 {}; load average {}",
        cpus[0],
        if avx2 { "yes (used)" } else { "no" },
        loadavg()
    );
    println!();
    println!("| conversion | ns per 64-dim row | per element | copy of the output bytes, ns/row |");
    println!("|---|---|---|---|");
    let values: Vec<f32> = (0..rows * DIM)
        .map(|i| ((i * 7919) % 2001) as f32 * 1e-3 - 1.0)
        .collect();
    let cases: [(&str, Float, Float, Option<f32>); 8] = [
        ("f32 -> bf16 (pull, PS side)", Float::F32, Float::Bf16, None),
        (
            "bf16 -> f32 (pull, worker side)",
            Float::Bf16,
            Float::F32,
            None,
        ),
        ("f32 -> f16", Float::F32, Float::F16, None),
        ("f16 -> f32", Float::F16, Float::F32, None),
        (
            "f32 x scale -> bf16 (push, worker side)",
            Float::F32,
            Float::Bf16,
            Some(1024.0),
        ),
        (
            "bf16 -> f32 / scale (push, PS side)",
            Float::Bf16,
            Float::F32,
            Some(1.0 / 1024.0),
        ),
        ("f32 x scale -> f16", Float::F32, Float::F16, Some(1024.0)),
        (
            "f16 -> f32 / scale",
            Float::F16,
            Float::F32,
            Some(1.0 / 1024.0),
        ),
    ];
    for (name, from, to, mul) in cases {
        let mut src = vec![0u8; rows * DIM * from.size()];
        float::narrow_from(&values, from.dtype(), &mut src, None).expect("source");
        let mut dst = vec![0u8; rows * DIM * to.size()];
        let ns = per_row(rows, || {
            float::convert(from.dtype(), black_box(&src), to.dtype(), &mut dst, mul)
                .expect("convert");
            black_box(&mut dst);
        });
        let same = vec![1u8; dst.len()];
        let copy = per_row(rows, || {
            dst.copy_from_slice(black_box(&same));
            black_box(&mut dst);
        });
        println!("| {name} | {ns:.2} | {:.3} | {copy:.2} |", ns / DIM as f64);
    }
}
