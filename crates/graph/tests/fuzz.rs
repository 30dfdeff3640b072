//! Corrupted inputs, at least 1,000 variants per format — and as many as fit in
//! `GRINNDER_FUZZ_SECONDS` per format when it is set (CI sets 10, .ci/slow 60): every loader returns a dataset
//! that passes validation or an error naming the file — never a panic. Native files, which
//! carry checksums, must moreover never load as anything but the original data.

mod common;

use std::io::{Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use common::*;
use grinnder_graph::io::{self, exchange, igb, native, ogb, ogb_npz, Format, LoadOptions};
use grinnder_graph::rng::Stream;
use grinnder_graph::Dataset;

const VARIANTS: usize = 1000;

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// One random corruption of a byte string.
fn mutate_bytes(s: &mut Stream, b: &mut Vec<u8>) {
    let len = b.len().max(1) as u64;
    match s.below(6) {
        0 => {
            let i = s.below(len) as usize;
            if i < b.len() {
                b[i] ^= 1 << s.below(8);
            }
        }
        1 => b.truncate(s.below(len) as usize),
        2 => {
            let i = s.below(len) as usize;
            if i < b.len() {
                b[i] = s.below(256) as u8;
            }
        }
        3 => {
            let i = s.below(len + 1) as usize;
            b.insert(i.min(b.len()), s.below(256) as u8);
        }
        4 => {
            let i = s.below(len) as usize;
            if i < b.len() {
                b.remove(i);
            }
        }
        _ => {
            // overwrite a run with a "dangerous" value
            let v = [0u8, 0xFF, 0x7F, 0x80][s.below(4) as usize];
            let i = s.below(len) as usize;
            for x in b.iter_mut().skip(i).take(1 + s.below(8) as usize) {
                *x = v;
            }
        }
    }
}

/// One random corruption of CSV text (kept as text, recompressed by the caller).
fn mutate_text(s: &mut Stream, t: &mut Vec<u8>) {
    const PIECES: [&[u8]; 12] =
        [b",", b"\n", b"-", b".", b"nan", b"inf", b"99999999999", b"-1", b"1e40", b" ", b"x", b""];
    let len = t.len().max(1) as u64;
    match s.below(4) {
        0 => {
            let i = (s.below(len) as usize).min(t.len());
            let p = PIECES[s.below(PIECES.len() as u64) as usize];
            t.splice(i..i, p.iter().copied());
        }
        1 => {
            let i = (s.below(len) as usize).min(t.len());
            let j = (i + 1 + s.below(6) as usize).min(t.len());
            t.drain(i..j);
        }
        2 => {
            // duplicate or drop a line
            let lines: Vec<&[u8]> = t.split(|&c| c == b'\n').collect();
            let k = s.below(lines.len() as u64) as usize;
            let mut out: Vec<u8> = Vec::new();
            let dup = s.below(2) == 0;
            for (i, l) in lines.iter().enumerate() {
                if i == k && !dup {
                    continue;
                }
                let reps = if i == k && dup { 2 } else { 1 };
                for _ in 0..reps {
                    out.extend_from_slice(l);
                    out.push(b'\n');
                }
            }
            out.pop();
            *t = out;
        }
        _ => {
            let i = s.below(len) as usize;
            if i < t.len() {
                t[i] = b"0123456789,.-e\n "[s.below(16) as usize];
            }
        }
    }
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(b).read_to_end(&mut out).unwrap();
    out
}

fn gzip(t: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(t).unwrap();
    e.finish().unwrap()
}

struct Outcome {
    ok: usize,
    refused: usize,
}

/// Seconds of fuzzing per format beyond the first `VARIANTS` variants.
fn fuzz_seconds() -> f64 {
    std::env::var("GRINNDER_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(0.0)
}

/// Runs `variants` corruptions of the dataset in `dir` through `load`.
fn fuzz(
    dir: &Path,
    seed: u64,
    corrupt: &dyn Fn(&mut Stream, &Path) -> Vec<u8>,
    check_ok: &dyn Fn(&Dataset),
    load: &dyn Fn(&Path) -> Result<Dataset, String>,
) -> Outcome {
    let all = files(dir);
    let mut out = Outcome { ok: 0, refused: 0 };
    let start = std::time::Instant::now();
    for v in 0.. {
        if v >= VARIANTS && start.elapsed().as_secs_f64() >= fuzz_seconds() {
            break;
        }
        let mut s = Stream::new(&[seed, v as u64]);
        let victim = &all[s.below(all.len() as u64) as usize];
        let original = std::fs::read(victim).unwrap();
        let bad = corrupt(&mut s, victim);
        std::fs::write(victim, &bad).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| load(dir)));
        std::fs::write(victim, &original).unwrap();
        match r {
            Err(_) => panic!("variant {v}: loader panicked on corrupted {}", victim.display()),
            Ok(Ok(ds)) => {
                ds.validate(dir).expect("a loaded dataset is valid");
                check_ok(&ds);
                out.ok += 1;
            }
            Ok(Err(msg)) => {
                assert!(!msg.is_empty());
                out.refused += 1;
            }
        }
    }
    out
}

fn load_auto(p: &Path) -> Result<Dataset, String> {
    io::open(p, Format::Auto, &LoadOptions::default()).map_err(|e| e.to_string())
}

fn report(name: &str, o: &Outcome) {
    let n = o.ok + o.refused;
    eprintln!(
        "{name}: {n} corrupted variants, {} refused with an error, {} loaded valid, 0 panics",
        o.refused, o.ok
    );
    assert!(n >= VARIANTS);
    assert!(o.refused > n / 4, "most corruptions should be noticed");
}

#[test]
fn ogb_raw_survives_corruption() {
    let dir = tempfile::tempdir().unwrap();
    ogb::write(&tiny(24, 3, 1), dir.path(), "s").unwrap();
    let corrupt = |s: &mut Stream, p: &Path| {
        let mut b = std::fs::read(p).unwrap();
        if s.below(4) == 0 {
            mutate_bytes(s, &mut b); // damage the gzip stream itself
            b
        } else {
            let mut t = gunzip(&b);
            mutate_text(s, &mut t);
            gzip(&t)
        }
    };
    let o = fuzz(dir.path(), 1, &corrupt, &|_| {}, &load_auto);
    report("OGB raw", &o);
}

#[test]
fn npy_exchange_survives_corruption() {
    let dir = tempfile::tempdir().unwrap();
    exchange::save(&tiny(24, 3, 2), dir.path()).unwrap();
    let corrupt = |s: &mut Stream, p: &Path| {
        let mut b = std::fs::read(p).unwrap();
        // half the time aim at the header, where structure lives
        if s.below(2) == 0 && b.len() > 128 {
            let mut head = b[..128].to_vec();
            mutate_bytes(s, &mut head);
            head.extend_from_slice(&b[128..]);
            head
        } else {
            mutate_bytes(s, &mut b);
            b
        }
    };
    let o = fuzz(dir.path(), 2, &corrupt, &|_| {}, &load_auto);
    report("npy exchange", &o);
}

/// The members of an `.npz` archive with one of them corrupted (its `.npy` header half the
/// time), written again deflated as `np.savez_compressed` writes them.
fn corrupt_npz_member(s: &mut Stream, archive: &[u8]) -> Vec<u8> {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(archive)).unwrap();
    let mut members: Vec<(String, Vec<u8>)> = (0..z.len())
        .map(|i| {
            let mut f = z.by_index(i).unwrap();
            let mut b = Vec::new();
            f.read_to_end(&mut b).unwrap();
            (f.name().to_string(), b)
        })
        .collect();
    let k = s.below(members.len() as u64) as usize;
    let b = &mut members[k].1;
    if s.below(2) == 0 && b.len() > 128 {
        let mut head = b[..128].to_vec();
        mutate_bytes(s, &mut head);
        head.extend_from_slice(&b[128..]);
        *b = head;
    } else {
        mutate_bytes(s, b);
    }
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    for (name, bytes) in &members {
        w.start_file(name.as_str(), opts).unwrap();
        w.write_all(bytes).unwrap();
    }
    w.finish().unwrap().into_inner()
}

#[test]
fn ogb_binary_survives_corruption() {
    let dir = tempfile::tempdir().unwrap();
    ogb_npz::write(&tiny(24, 3, 7), dir.path(), "time").unwrap();
    let corrupt = |s: &mut Stream, p: &Path| {
        let mut b = std::fs::read(p).unwrap();
        let npz = p.extension().is_some_and(|e| e == "npz");
        if npz && s.below(4) != 0 {
            return corrupt_npz_member(s, &b);
        }
        // the archive itself (its directory, deflate streams, checksums), or a split file
        mutate_bytes(s, &mut b);
        b
    };
    let o = fuzz(dir.path(), 7, &corrupt, &|_| {}, &load_auto);
    report("OGB binary (npz)", &o);
}

#[test]
fn igb_survives_corruption() {
    for raw in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        igb::write(&tiny(24, 3, 3), dir.path(), raw).unwrap();
        let corrupt = |s: &mut Stream, p: &Path| {
            let mut b = std::fs::read(p).unwrap();
            mutate_bytes(s, &mut b);
            b
        };
        let o = fuzz(dir.path(), 3 + raw as u64, &corrupt, &|_| {}, &load_auto);
        report(if raw { "IGB (headerless features)" } else { "IGB" }, &o);
    }
}

#[test]
fn native_never_loads_wrong_data() {
    let dir = tempfile::tempdir().unwrap();
    let original = tiny(24, 3, 5);
    let file = dir.path().join("d.grnd");
    native::save(&original, &file).unwrap();
    let corrupt = |s: &mut Stream, p: &Path| {
        let mut b = std::fs::read(p).unwrap();
        for _ in 0..1 + s.below(3) {
            mutate_bytes(s, &mut b);
        }
        b
    };
    let same = |ds: &Dataset| assert_same(&original, ds);
    let load = |d: &Path| native::open(&d.join("d.grnd"), native::Verify::Full).map_err(|e| e.to_string());
    let o = fuzz(dir.path(), 6, &corrupt, &same, &load);
    report("native", &o);
}
