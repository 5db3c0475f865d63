//! `PsTable` checkpoints in memory and on the local disk: round trips (rows, optimizer
//! state, clock; several blocks; half-precision rows), a save while threads push, and every
//! kind of bad file, each refused with an error that names the file and what is wrong, and
//! no table.

use std::fs;
use std::path::{Path, PathBuf};

use starwire::rows::ps::{
    checkpoint_file, CheckpointError, CheckpointErrorKind, Float, Init, Optimizer, PsTable,
    PsTableBuilder, CHECKPOINT_VERSION,
};
use starwire::{Status, Table};

/// A fresh directory for one test, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("starwire-ckpt-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn adagrad_table(table_id: u32) -> PsTableBuilder {
    PsTable::builder(16)
        .table_id(table_id)
        .init(Init::Uniform {
            scale: 0.1,
            seed: 3,
        })
        .optimizer(Optimizer::Adagrad {
            lr: 0.1,
            initial_accumulator: 0.1,
        })
        .huge_pages(false)
}

/// Every row of `t` with its state, sorted by id.
fn rows_of(t: &PsTable) -> Vec<(u64, Vec<f32>, Vec<f32>)> {
    let mut rows = Vec::new();
    t.for_each_row(|id, v, s| rows.push((id, v.to_vec(), s.to_vec())));
    rows.sort_by_key(|r| r.0);
    rows
}

/// A saved table of `n` rows, pushed to, clock at 7; its rows.
fn saved(dir: &Path, n: u64) -> Vec<(u64, Vec<f32>, Vec<f32>)> {
    let t = adagrad_table(4).build().unwrap();
    let ids: Vec<u64> = (0..n).map(|i| i * 31 + 5).collect();
    for batch in ids.chunks(1000) {
        let grads = bytes(&vec![0.5; 16 * batch.len()]);
        assert_eq!(t.push(batch, &grads), Status::Ok);
    }
    t.set_clock(7);
    let report = t.save(dir).unwrap();
    assert_eq!(report.rows, n);
    assert_eq!(report.path, dir.join("table-4.swrows"));
    assert_eq!(fs::metadata(&report.path).unwrap().len(), report.bytes);
    assert!(report.elapsed >= report.writing);
    rows_of(&t)
}

fn load_err(b: PsTableBuilder, dir: &Path) -> CheckpointError {
    match b.load(dir) {
        Ok(t) => panic!("loaded a table of {} rows", t.len()),
        Err(e) => e,
    }
}

#[test]
fn round_trip_of_rows_state_and_clock() {
    let dir = Dir::new("round-trip");
    // 50,000 rows of 136 bytes: two blocks of 4 MiB.
    let rows = saved(&dir.0, 50_000);
    let t = adagrad_table(4).load(&dir.0).unwrap();
    assert_eq!(t.clock(), 7);
    assert_eq!(t.len(), 50_000);
    assert_eq!(t.metrics().loaded, 50_000);
    assert_eq!(rows_of(&t), rows);
    // Loaded rows serve and train as before.
    let mut out = vec![0u8; 64];
    let mut missing = Vec::new();
    assert_eq!(t.pull(&[5], &mut out, &mut missing), Status::Ok);
    assert!(missing.is_empty());
    // No temporary file left behind; the file is where the name says.
    let names: Vec<String> = fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, [checkpoint_file(4)]);

    // A second save replaces the first.
    t.push(&[5], &bytes(&[1.0; 16]));
    t.save(&dir.0).unwrap();
    let again = adagrad_table(4).load(&dir.0).unwrap();
    assert_eq!(again.get(5), t.get(5));
    assert_ne!(again.get(5).unwrap(), rows[0].1);
}

#[test]
fn round_trip_of_half_precision_rows_with_adam() {
    let dir = Dir::new("bf16");
    let b = PsTable::builder(5)
        .table_id(9)
        .stored_as(Float::Bf16)
        .optimizer(Optimizer::adam(0.01))
        .init(Init::TruncatedNormal { std: 0.3, seed: 1 })
        .huge_pages(false);
    let t = b.clone().build().unwrap();
    let ids: Vec<u64> = (0..3000).collect();
    let mut out = vec![0u8; ids.len() * t.row_bytes()];
    let mut missing = Vec::new();
    t.pull(&ids, &mut out, &mut missing);
    t.push(&ids[..100], &bytes(&vec![0.25; 500]));
    t.save(&dir.0).unwrap();
    let loaded = b.load(&dir.0).unwrap();
    assert_eq!(rows_of(&loaded), rows_of(&t));
    // An empty table saves and loads too.
    let empty = Dir::new("empty");
    adagrad_table(4).build().unwrap().save(&empty.0).unwrap();
    assert!(adagrad_table(4).load(&empty.0).unwrap().is_empty());
}

/// Through the page cache (direct I/O off, as where a file system refuses it): the same
/// file.
#[test]
fn round_trip_through_the_page_cache() {
    let (direct, cached) = (Dir::new("direct"), Dir::new("cached"));
    let t = adagrad_table(4).build().unwrap();
    let ids: Vec<u64> = (0..70_000).collect();
    t.push(&ids, &bytes(&vec![0.25; 16 * ids.len()]));
    t.save(&direct.0).unwrap();
    let report = adagrad_table(4)
        .checkpoint_direct_io(false)
        .load(&direct.0)
        .unwrap()
        .save(&cached.0)
        .unwrap();
    assert!(!report.direct_io);
    let file = checkpoint_file(4);
    assert_eq!(
        fs::read(direct.0.join(&file)).unwrap(),
        fs::read(cached.0.join(&file)).unwrap()
    );
}

/// A save while threads push: a fuzzy snapshot. Every row created before the save is in
/// it, with a value some push left it at.
#[test]
fn save_while_pushing() {
    let dir = Dir::new("fuzzy");
    let t = PsTable::builder(4)
        .optimizer(Optimizer::Sgd { lr: 1.0 })
        .huge_pages(false)
        .build()
        .unwrap();
    let ids: Vec<u64> = (0..40_000).collect();
    t.load_rows(&ids, &vec![0.0; 4 * ids.len()], None).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for th in 0..2u64 {
            let (t, ids, stop) = (&t, &ids, &stop);
            s.spawn(move || {
                let mine: Vec<u64> = ids.iter().copied().filter(|i| i % 2 == th).collect();
                let grads = bytes(&vec![-1.0; 4 * 500]);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for batch in mine.chunks(500) {
                        t.push(batch, &grads[..batch.len() * 16]);
                    }
                }
            });
        }
        for _ in 0..3 {
            t.save(&dir.0).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let loaded = PsTable::builder(4).load(&dir.0).unwrap();
    assert_eq!(loaded.len(), 40_000);
    let final_max = t.get(0).unwrap()[0].max(t.get(1).unwrap()[0]);
    loaded.for_each_row(|_, v, _| {
        // Whole steps of one thread (elements of a row may be from two steps under Hogwild).
        assert!(v
            .iter()
            .all(|&x| x.fract() == 0.0 && x >= 0.0 && x <= final_max));
    });
}

/// Writes a good checkpoint of table 4 into `dir` and returns its bytes.
fn good(dir: &Path) -> Vec<u8> {
    saved(dir, 40_000);
    fs::read(dir.join(checkpoint_file(4))).unwrap()
}

/// Writes `bytes` as table 4's checkpoint in a fresh directory and loads it.
fn load_bytes(name: &str, bytes: &[u8]) -> CheckpointError {
    let dir = Dir::new(name);
    fs::write(dir.0.join(checkpoint_file(4)), bytes).unwrap();
    let e = load_err(adagrad_table(4), &dir.0);
    assert_eq!(e.path(), dir.0.join(checkpoint_file(4)));
    assert!(
        e.to_string().contains(&checkpoint_file(4)),
        "the message names the file: {e}"
    );
    e
}

#[test]
fn bad_files_are_refused_with_what_is_wrong() {
    let src = Dir::new("bad-src");
    let file = good(&src.0);
    let header = 128;

    // Missing.
    let empty = Dir::new("missing");
    let e = load_err(adagrad_table(4), &empty.0);
    assert!(matches!(
        e.kind(),
        CheckpointErrorKind::Io {
            doing: "opening",
            ..
        }
    ));
    assert!(e.to_string().contains("opening"), "{e}");

    // Not a checkpoint at all, long or short.
    let e = load_bytes("text", &b"name,value\n".repeat(100));
    assert!(
        matches!(e.kind(), CheckpointErrorKind::NotACheckpoint),
        "{e}"
    );
    let e = load_bytes("tiny", b"x");
    assert!(
        matches!(e.kind(), CheckpointErrorKind::NotACheckpoint),
        "{e}"
    );

    // Truncated: inside the header, inside a block, without the trailer.
    for (name, len) in [
        ("cut-header", 100),
        ("cut-block", file.len() / 2),
        ("cut-trailer", file.len() - 32),
        ("cut-last-byte", file.len() - 1),
    ] {
        let e = load_bytes(name, &file[..len]);
        assert!(
            matches!(e.kind(), CheckpointErrorKind::Truncated { .. }),
            "{name}: {e}"
        );
        assert!(e.to_string().contains("truncated"), "{e}");
    }

    // Bytes after the end.
    let mut long = file.clone();
    long.extend_from_slice(&[0; 10]);
    let e = load_bytes("long", &long);
    assert!(
        matches!(e.kind(), CheckpointErrorKind::Corrupted { .. }),
        "{e}"
    );

    // A flipped bit in a row, in the header, in a block header, in the trailer.
    let flip = |at: usize| {
        let mut f = file.clone();
        f[at] ^= 0x10;
        f
    };
    let e = load_bytes("flip-row", &flip(header + 16 + 1000));
    assert!(
        e.to_string()
            .contains("block 0 of 2: its checksum does not match"),
        "{e}"
    );
    let e = load_bytes("flip-second-block", &flip(file.len() - 500));
    assert!(e.to_string().contains("block 1 of 2"), "{e}");
    let e = load_bytes("flip-dim", &flip(20));
    assert!(e.to_string().contains("header's checksum"), "{e}");
    let e = load_bytes("flip-block-count", &flip(header));
    assert!(e.to_string().contains("block 0 holds"), "{e}");
    let e = load_bytes("flip-trailer", &flip(file.len() - 3));
    assert!(e.to_string().contains("trailer"), "{e}");

    // Another version (the checksum is not even read: the header may differ).
    let mut v2 = file.clone();
    v2[8..12].copy_from_slice(&(CHECKPOINT_VERSION + 1).to_le_bytes());
    let e = load_bytes("version", &v2);
    assert!(matches!(
        e.kind(),
        CheckpointErrorKind::Version {
            found: 2,
            supported: 1
        }
    ));
    assert!(
        e.to_string()
            .contains("format version 2, this build reads version 1"),
        "{e}"
    );
}

#[test]
fn wrong_shapes_are_refused() {
    let dir = Dir::new("shapes");
    saved(&dir.0, 1000);
    let shape = |b: PsTableBuilder| {
        let e = load_err(b, &dir.0);
        assert!(matches!(e.kind(), CheckpointErrorKind::Shape { .. }), "{e}");
        e.to_string()
    };
    let adagrad = Optimizer::Adagrad {
        lr: 0.5,
        initial_accumulator: 1.0,
    };
    let e = shape(PsTable::builder(8).table_id(4).optimizer(adagrad));
    assert!(
        e.contains("wrong shape: dim 16 in the file, 8 in the table"),
        "{e}"
    );
    let e = shape(
        PsTable::builder(16)
            .table_id(4)
            .optimizer(adagrad)
            .stored_as(Float::Bf16),
    );
    assert!(
        e.contains("rows stored as F32 in the file, Bf16 in the table"),
        "{e}"
    );
    let e = shape(
        PsTable::builder(16)
            .table_id(4)
            .optimizer(Optimizer::adam(0.1)),
    );
    assert!(
        e.contains("optimizer state adagrad in the file, adam"),
        "{e}"
    );
    // Another table's file under this table's name.
    fs::rename(
        dir.0.join(checkpoint_file(4)),
        dir.0.join(checkpoint_file(5)),
    )
    .unwrap();
    let e = shape(PsTable::builder(16).table_id(5).optimizer(adagrad));
    assert!(e.contains("table 4 in the file, 5 in the table"), "{e}");
    fs::rename(
        dir.0.join(checkpoint_file(5)),
        dir.0.join(checkpoint_file(4)),
    )
    .unwrap();
    // Other learning rates are fine: the parameters are the loading table's.
    assert_eq!(
        PsTable::builder(16)
            .table_id(4)
            .optimizer(adagrad)
            .load(&dir.0)
            .unwrap()
            .len(),
        1000
    );
    // More rows than the table may hold.
    let e = load_err(adagrad_table(4).max_rows(999), &dir.0);
    assert!(
        e.to_string()
            .contains("1000 rows, more than the table's max_rows 999"),
        "{e}"
    );
}
