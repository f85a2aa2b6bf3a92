//! A process's own files in shared places (the temporary directory, /dev/shm): names no other
//! process can guess, and directories made fresh with mode 0700 that never follow what is there.
use std::path::PathBuf;

/// 128 random bits in hex: a name part no other local user can predict.
pub fn unguessable() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Makes `<temporary directory>/<prefix><unguessable>` with mode 0700. `create`, not
/// `create_dir_all`: anything already at that path (a planted symlink) is an error, not followed.
pub fn fresh_dir(prefix: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("{prefix}{}", unguessable()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn fresh_dirs_are_private_and_distinct() {
        let a = super::fresh_dir("mesh-private-test-").unwrap();
        let b = super::fresh_dir("mesh-private-test-").unwrap();
        assert_ne!(a, b);
        assert_eq!(std::fs::metadata(&a).unwrap().permissions().mode() & 0o777, 0o700);
        let suffix = a
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .trim_start_matches("mesh-private-test-");
        assert_eq!(suffix.len(), 32);
        std::fs::remove_dir(a).unwrap();
        std::fs::remove_dir(b).unwrap();
    }
}
