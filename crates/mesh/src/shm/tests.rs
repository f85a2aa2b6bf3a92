//! Tests of shared-memory regions against real POSIX shared-memory objects.
use super::*;

/// A real POSIX shared-memory object (what `shm_open` + `ftruncate` make), removed on drop.
struct Object(String);

impl Object {
    fn new(tag: &str, bytes: &[u8]) -> Object {
        let key = format!("/mesh_test_{}_{tag}", std::process::id());
        std::fs::write(format!("/dev/shm{key}"), bytes).unwrap();
        Object(key)
    }
    fn path(&self) -> String {
        format!("/dev/shm{}", self.0)
    }
}

impl Drop for Object {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.path());
    }
}

fn params(region: &str, size: u64, offset: Option<u64>) -> Params {
    let mut p = vec![
        (REGION.to_string(), Param::String(region.into())),
        (BYTE_SIZE.to_string(), Param::Uint(size)),
        ("other".to_string(), Param::Bool(true)),
    ];
    if let Some(o) = offset {
        p.push((OFFSET.to_string(), Param::Int(o as i64)));
    }
    p
}

#[test]
fn inputs_are_read_and_outputs_written_at_their_offsets() {
    let obj = Object::new("rw", &(0u8..32).collect::<Vec<_>>());
    let shm = SharedMemory::default();
    // The region is bytes 8..24 of the object; references are relative to it.
    shm.register_system("r", &obj.0, 8, 16).unwrap();
    let mut p = params("r", 4, Some(2));
    let input = shm.take_ref("input", "a", &mut p).unwrap().unwrap();
    assert_eq!(
        p,
        vec![("other".to_string(), Param::Bool(true))],
        "shm parameters are taken out"
    );
    assert_eq!(input.read().unwrap().as_ref(), &[10, 11, 12, 13]);

    let out = shm
        .take_ref("output", "y", &mut params("r", 8, Some(8)))
        .unwrap()
        .unwrap();
    out.write("y", &[0xAA, 0xBB]).unwrap();
    let on_disk = std::fs::read(obj.path()).unwrap();
    assert_eq!(
        &on_disk[16..19],
        &[0xAA, 0xBB, 18],
        "written at 8 + 8, nothing past the data"
    );
    let e = out.write("y", &[0; 9]).unwrap_err();
    assert!(
        e.message
            .contains("for output 'y' (8 bytes) should be at least 9 bytes to hold the results"),
        "{e}"
    );
}

#[test]
fn no_parameters_means_no_reference() {
    let shm = SharedMemory::default();
    let mut p = vec![("binary_data_size".to_string(), Param::Uint(4))];
    assert!(shm.take_ref("input", "a", &mut p).unwrap().is_none());
    assert_eq!(p.len(), 1);
}

#[test]
fn bad_references_get_errors_that_name_the_problem() {
    let obj = Object::new("bad", &[0; 16]);
    let shm = SharedMemory::default();
    shm.register_system("r", &obj.0, 0, 16).unwrap();
    let cases: Vec<(Params, &str)> = vec![
        // Triton's words for offsets and sizes past the region, then what was asked.
        (
            params("r", 17, None),
            "Invalid offset + byte size for shared memory region: 'r' (input 'a': offset 0 + byte size 17 is beyond the 16 bytes",
        ),
        (params("r", 4, Some(13)), "Invalid offset + byte size for shared memory region: 'r'"),
        (params("r", 4, Some(16)), "Invalid offset for shared memory region: 'r' (input 'a': offset 16"),
        (params("r", u64::MAX, Some(u64::MAX >> 1)), "Invalid offset for shared memory region"),
        (
            vec![(REGION.into(), Param::String("r".into()))],
            "needs 'shared_memory_byte_size'",
        ),
        (
            vec![(BYTE_SIZE.into(), Param::Uint(4))],
            "without 'shared_memory_region'",
        ),
        (
            vec![(REGION.into(), Param::Int(3)), (BYTE_SIZE.into(), Param::Uint(4))],
            "must be a string",
        ),
        (
            vec![
                (REGION.into(), Param::String("r".into())),
                (BYTE_SIZE.into(), Param::Int(-4)),
            ],
            "must be a non-negative integer",
        ),
    ];
    let e = shm.take_ref("input", "a", &mut params("nope", 4, None)).unwrap_err();
    assert_eq!(e.code, Code::NotFound, "Triton answers 404 / NOT_FOUND");
    assert_eq!(
        e.message,
        "Unable to find shared memory region: 'nope' (named by input 'a')"
    );
    for (mut p, want) in cases {
        let e = shm.take_ref("input", "a", &mut p).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(
            (e.message.starts_with("input 'a': ") || e.message.starts_with("Invalid offset"))
                && e.message.contains(want),
            "want '{want}' in '{e}'"
        );
    }
}

#[test]
fn registration_checks_the_key_and_the_object_size() {
    let obj = Object::new("reg", &[0; 64]);
    let shm = SharedMemory::default();
    // A key that cannot be opened is Triton's INTERNAL "Unable to open shared memory region: 'KEY'".
    for (key, want) in [
        (
            "/mesh_test_does_not_exist",
            "Unable to open shared memory region: '/mesh_test_does_not_exist' (region 'r': the key cannot be opened",
        ),
        (
            "/../etc/passwd",
            "Unable to open shared memory region: '/../etc/passwd' (not a valid shared memory key",
        ),
        ("", "Unable to open shared memory region: '' (not a valid"),
    ] {
        let e = shm.register_system("r", key, 0, 8).unwrap_err();
        assert_eq!(e.code, Code::Internal, "{e}");
        assert!(e.message.starts_with(want), "want '{want}' in '{e}'");
    }
    for (key, offset, size, want) in [
        (obj.0.as_str(), 60, 8, "offset 60 + byte_size 8 is beyond the 64 bytes"),
        (obj.0.as_str(), u64::MAX, 8, "overflows"),
        (obj.0.as_str(), 0, 0, "byte_size must be positive"),
    ] {
        let e = shm.register_system("r", key, offset, size).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.contains(want), "want '{want}' in '{e}'");
    }
    assert!(
        shm.system_status("").unwrap().is_empty(),
        "failed registrations leave nothing"
    );

    shm.register_system("r", &obj.0, 0, 64).unwrap();
    let e = shm.register_system("r", &obj.0, 0, 8).unwrap_err();
    assert_eq!(e.code, Code::AlreadyExists);
    // Another name for the same object is fine (clients split one object into several regions).
    shm.register_system("r2", &obj.0, 32, 32).unwrap();
    let status = shm.system_status("").unwrap();
    assert_eq!(status.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["r", "r2"]);
    assert_eq!(status[1].offset, 32);
    assert_eq!(shm.system_status("r2").unwrap(), vec![status[1].clone()]);
    assert_eq!(shm.system_status("zz").unwrap_err().code, Code::NotFound);
    assert!(shm.cuda_status("").unwrap().is_empty());
    assert_eq!(
        shm.cuda_status("r").unwrap_err().code,
        Code::NotFound,
        "kinds are reported apart"
    );
}

#[test]
fn a_region_in_use_cannot_be_unregistered_as_in_triton() {
    let obj = Object::new("inuse", &[7; 8]);
    let shm = SharedMemory::default();
    shm.register_system("r", &obj.0, 0, 8).unwrap();
    let held = shm.take_ref("input", "a", &mut params("r", 8, None)).unwrap().unwrap();
    let e = shm.unregister_system("r").unwrap_err();
    assert_eq!(
        e.message,
        "Cannot unregister shared memory region 'r', it is currently in use."
    );
    let e = shm.unregister_system("").unwrap_err();
    assert_eq!(
        e.message,
        "Failed to unregister the following system shared memory regions: r"
    );
    assert_eq!(shm.system_status("").unwrap().len(), 1, "a region in use stays");
    drop(obj); // the client even removed the object
    assert_eq!(
        held.read().unwrap().as_ref(),
        &[7; 8],
        "the request still reads its memory"
    );
    drop(held);
    shm.unregister_system("r").unwrap();
    let e = shm.take_ref("input", "a", &mut params("r", 8, None)).unwrap_err();
    assert!(e.message.contains("Unable to find shared memory region: 'r'"), "{e}");
    shm.unregister_system("r").unwrap();
    shm.unregister_system("never-was").unwrap();
}

#[test]
fn unregister_all_takes_only_its_own_kind() {
    let obj = Object::new("all", &[0; 8]);
    let shm = SharedMemory::default();
    shm.register_system("a", &obj.0, 0, 4).unwrap();
    shm.register_system("b", &obj.0, 4, 4).unwrap();
    shm.unregister_cuda("").unwrap();
    assert_eq!(shm.system_status("").unwrap().len(), 2);
    assert!(shm
        .unregister_cuda("a")
        .unwrap_err()
        .message
        .contains("not a CUDA region"));
    shm.unregister_system("").unwrap();
    assert!(shm.system_status("").unwrap().is_empty());
}

#[test]
fn a_shrunken_object_is_an_error_not_a_crash() {
    let obj = Object::new("shrink", &[1; 4096 * 2]);
    let shm = SharedMemory::default();
    shm.register_system("r", &obj.0, 0, 4096 * 2).unwrap();
    let r = shm
        .take_ref("input", "a", &mut params("r", 4096 * 2, None))
        .unwrap()
        .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(obj.path())
        .unwrap()
        .set_len(16)
        .unwrap();
    // Reads and writes go through the descriptor, never a mapping: no SIGBUS, whenever it shrinks.
    let e = r.read().unwrap_err();
    assert!(e.message.contains("shrank to 16 bytes"), "{e}");
    assert!(r.write("y", &[0; 4096 + 1]).unwrap_err().message.contains("shrank"));
    assert_eq!(
        std::fs::metadata(obj.path()).unwrap().len(),
        16,
        "a write never grows the client's object"
    );
}

#[test]
fn an_input_size_is_checked_against_its_shape_before_anything_is_read() {
    let obj = Object::new("insize", &[0; 64]);
    let shm = SharedMemory::default();
    shm.register_system("r", &obj.0, 0, 64).unwrap();
    let r = shm.take_ref("input", "a", &mut params("r", 64, None)).unwrap().unwrap();
    let e = r.read_input("m", "a", mesh_dtype(), &[1, 4]).unwrap_err();
    assert_eq!(
        e.message,
        "input byte size mismatch for input 'a' for model 'm'. Expected 16, got 64"
    );
    assert_eq!(r.read_input("m", "a", mesh_dtype(), &[4, 4]).unwrap().len(), 64);
}

fn mesh_dtype() -> crate::DataType {
    crate::DataType::Fp32
}

#[test]
fn registrations_are_bounded() {
    let obj = Object::new("many", &[0; 8]);
    let shm = SharedMemory::with_limit(8);
    for i in 0..8 {
        shm.register_system(&format!("r{i}"), &obj.0, 0, 8).unwrap();
    }
    let e = shm.register_system("one-more", &obj.0, 0, 8).unwrap_err();
    assert!(e.message.contains("regions are registered already"), "{e}");
    shm.unregister_system("").unwrap();
    shm.register_system("one-more", &obj.0, 0, 8).unwrap();
}

#[test]
fn cuda_registration_without_a_usable_driver_is_a_clear_error() {
    let shm = SharedMemory::default();
    let e = shm.register_cuda("c", &[0; 10], 0, 16).unwrap_err();
    assert!(e.message.contains("raw_handle must be the 64 bytes"), "{e}");
    // Triton's aio tests register ("", b"", 0, 0) and match its "invalid args".
    let e = shm.register_cuda("", &[], 0, 0).unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    assert!(
        e.message
            .starts_with("failed to register shared memory region '': invalid args"),
        "{e}"
    );
    // On a machine without CUDA this names the missing driver; with one, a zero handle fails to
    // open. Either way nothing is registered and the server goes on.
    let e = shm.register_cuda("c", &[0; CUDA_HANDLE_SIZE], 0, 16).unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    assert!(e.message.contains("CUDA"), "{e}");
    assert!(shm.cuda_status("").unwrap().is_empty());
}

#[test]
fn a_registration_without_a_name_is_checked_in_tritons_order() {
    let obj = Object::new("noname", &[0; 16]);
    let shm = SharedMemory::default();
    // Neither name nor key (Triton's gRPC aio test): the key is opened first, and fails.
    let e = shm.register_system("", "", 0, 0).unwrap_err();
    assert_eq!(e.code, Code::Internal);
    assert!(e.message.starts_with("Unable to open shared memory region: ''"), "{e}");
    // A key that opens: the name is still required (Triton's gRPC would keep a nameless region).
    let e = shm.register_system("", &obj.0, 0, 16).unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    assert_eq!(
        e.message,
        "'region name' is necessary to register system shared memory region"
    );
    assert!(shm.system_status("").unwrap().is_empty());
}
