//! Tests of the shipment manifest, key and the cache's verifying receiver (files only, no sockets).
use super::*;

fn model_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("1")).unwrap();
    std::fs::write(d.path().join("config.pbtxt"), "name: \"m\"").unwrap();
    std::fs::write(d.path().join("1/model.onnx"), vec![7u8; 10_000]).unwrap();
    std::fs::write(d.path().join("1/empty.txt"), b"").unwrap();
    d
}

/// Sends the manifest's files through a receiver in `chunk`-byte pieces.
fn ship(dir: &Path, m: &Manifest, cache: &Cache, chunk: usize) -> Result<PathBuf, String> {
    let mut r = cache.receive("m", &m.key, m.files.clone(), u64::MAX)?;
    for (i, f) in m.files.iter().enumerate() {
        let bytes = std::fs::read(dir.join(&f.path)).unwrap();
        for (n, piece) in bytes.chunks(chunk).enumerate() {
            r.chunk(i as u32, (n * chunk) as u64, piece)?;
        }
    }
    r.finish()
}

#[test]
fn manifest_lists_files_sorted_and_keys_by_content() {
    let d = model_dir();
    let m = manifest("m", d.path()).unwrap();
    let paths: Vec<_> = m.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["1/empty.txt", "1/model.onnx", "config.pbtxt"]);
    assert_eq!(m.total(), 10_009);
    assert_eq!(m.key.len(), 64);
    assert_eq!(manifest("m", d.path()).unwrap().key, m.key, "same content, same key");
    assert_ne!(
        manifest("other", d.path()).unwrap().key,
        m.key,
        "the name is part of the key"
    );
    std::fs::write(d.path().join("1/model.onnx"), vec![8u8; 10_000]).unwrap();
    assert_ne!(manifest("m", d.path()).unwrap().key, m.key, "same size, other bytes");
}

#[test]
fn a_shipment_lands_whole_and_verified() {
    let d = model_dir();
    let m = manifest("m", d.path()).unwrap();
    let cache = Cache {
        root: tempfile::tempdir().unwrap().keep(),
    };
    assert!(!cache.has(&m.key, "m"));
    let dir = ship(d.path(), &m, &cache, 3000).unwrap();
    assert_eq!(dir, cache.dir(&m.key, "m"));
    assert!(cache.has(&m.key, "m"));
    assert_eq!(std::fs::read(dir.join("1/model.onnx")).unwrap(), vec![7u8; 10_000]);
    assert!(dir.join("1/empty.txt").is_file());
    // A second shipment of the same key (two placements racing) is as good as the first.
    assert_eq!(ship(d.path(), &m, &cache, 10_000).unwrap(), dir);
    let partials = std::fs::read_dir(&cache.root)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".partial")
        })
        .count();
    assert_eq!(partials, 0, "no partial folder is left behind");
}

#[test]
fn tampered_bytes_do_not_reach_the_cache() {
    let d = model_dir();
    let m = manifest("m", d.path()).unwrap();
    std::fs::write(d.path().join("1/model.onnx"), vec![9u8; 10_000]).unwrap();
    let cache = Cache {
        root: tempfile::tempdir().unwrap().keep(),
    };
    let e = ship(d.path(), &m, &cache, 4096).unwrap_err();
    assert!(e.contains("not to the key"), "{e}");
    assert!(!cache.has(&m.key, "m"));
    assert_eq!(
        std::fs::read_dir(&cache.root).unwrap().count(),
        0,
        "the partial copy is removed"
    );
}

#[test]
fn chunks_out_of_order_or_past_a_file_are_refused() {
    let d = model_dir();
    let m = manifest("m", d.path()).unwrap();
    let cache = Cache {
        root: tempfile::tempdir().unwrap().keep(),
    };
    let mut r = cache.receive("m", &m.key, m.files.clone(), u64::MAX).unwrap();
    assert!(r.chunk(1, 100, &[0; 10]).unwrap_err().contains("does not continue"));
    let mut r2 = cache.receive("m", &m.key, m.files.clone(), u64::MAX).unwrap();
    assert!(r2.chunk(1, 0, &[0; 10_001]).unwrap_err().contains("does not continue"));
    let mut r3 = cache.receive("m", &m.key, m.files.clone(), u64::MAX).unwrap();
    r3.chunk(1, 0, &[7; 10]).unwrap();
    assert!(r3.chunk(0, 0, &[]).unwrap_err().contains("out of order"));
    assert!(r3.chunk(9, 0, &[]).unwrap_err().contains("out of order"));
    let mut r4 = cache.receive("m", &m.key, m.files.clone(), u64::MAX).unwrap();
    r4.chunk(1, 0, &[7; 10]).unwrap();
    // The next file begins before this one is whole.
    assert!(r4.chunk(2, 0, b"x").unwrap_err().contains("ended at 10 of its 10000"));
    drop(r);
}

#[test]
fn unsafe_names_keys_and_sizes_are_refused_before_writing() {
    let cache = Cache {
        root: tempfile::tempdir().unwrap().keep(),
    };
    let key = "a".repeat(64);
    let file = |p: &str, size| FileEntry { path: p.into(), size };
    for bad in ["../x", "/etc/passwd", "a/../../b", "a//b", "./a", "a\\b", ""] {
        let e = cache.receive("m", &key, vec![file(bad, 1)], u64::MAX).unwrap_err();
        assert!(e.contains("not a plain relative path"), "{bad}: {e}");
    }
    assert!(cache
        .receive("m", "zz", vec![], u64::MAX)
        .unwrap_err()
        .contains("not a shipment key"));
    assert!(cache
        .receive("../m", &key, vec![], u64::MAX)
        .unwrap_err()
        .contains("model name"));
    let e = cache
        .receive("m", &key, vec![file("a", u64::MAX), file("b", 2)], 1 << 30)
        .unwrap_err();
    assert!(e.contains("more than this node accepts"), "{e}");
    assert_eq!(std::fs::read_dir(&cache.root).map(|d| d.count()).unwrap_or(0), 0);
}

#[test]
fn safe_paths() {
    assert!(safe_path("1/model.onnx"));
    assert!(safe_path("config.pbtxt"));
    assert!(!safe_path("1/../../x"));
    assert!(!safe_path("."));
}
