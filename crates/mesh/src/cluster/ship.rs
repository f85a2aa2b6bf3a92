//! Shipping a model's files over the cluster link: the router's manifest and content key, the
//! frames that carry the files, and the node's cache that verifies and keeps one copy per key.
//!
//! A shipment is keyed by a SHA-256 of the model's name and of every file's path, size and bytes,
//! so a node that already holds a key loads at once, and a node never serves files whose bytes do
//! not hash to the key the router placed. Files are received into a temporary folder of the cache
//! and renamed into place only once complete and verified.
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use quinn::{RecvStream, SendStream};
use sha2::{Digest, Sha256};

use super::frame::{self, FrameError, Limits, Payload};
use super::io::{read_frame, write_frame};
use super::msg::{Fetch, FetchEnd, FileChunk, FileEntry, Message, WireError};

/// Bytes of one file chunk frame.
pub const CHUNK: usize = 4 << 20;
/// Most files one model may have.
pub const MAX_FILES: usize = 10_000;
/// Deepest folder nesting inside a model directory.
pub const MAX_DEPTH: usize = 8;

/// What the router ships for one model: its key and files (sorted by path).
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub key: String,
    pub files: Vec<FileEntry>,
}

impl Manifest {
    /// Bytes of every file together.
    pub fn total(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// A shipment key: the 64 hex digits of a SHA-256.
pub fn is_key(key: &str) -> bool {
    key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A model name the cache may hold as a directory.
fn is_cache_name(name: &str) -> bool {
    crate::repository::check_model_name(name).is_ok()
}

/// Whether a path from the wire is a plain relative path that stays inside the model directory.
pub fn safe_path(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 1024
        && !path.starts_with('/')
        && !path.contains('\\')
        && !path.contains('\0')
        && path.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Lists a model directory's files (relative '/'-separated paths, sorted) with their sizes.
fn list(dir: &Path) -> Result<Vec<FileEntry>, String> {
    let mut files = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new(), 0usize)];
    while let Some((at, prefix, depth)) = stack.pop() {
        let entries = std::fs::read_dir(&at).map_err(|e| format!("cannot read {}: {e}", at.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot read {}: {e}", at.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            // Follows links, as loading the model would.
            let meta = std::fs::metadata(entry.path()).map_err(|e| format!("cannot read {path}: {e}"))?;
            if meta.is_dir() {
                if depth + 1 > MAX_DEPTH {
                    return Err(format!("{path}: folders nest deeper than {MAX_DEPTH}"));
                }
                stack.push((entry.path(), path, depth + 1));
            } else if meta.is_file() {
                if !safe_path(&path) {
                    return Err(format!("{path}: a file name the cluster link cannot carry"));
                }
                files.push(FileEntry { path, size: meta.len() });
                if files.len() > MAX_FILES {
                    return Err(format!("more than {MAX_FILES} files"));
                }
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

fn hash_entry(h: &mut Sha256, f: &FileEntry) {
    h.update(f.path.as_bytes());
    h.update([0]);
    h.update(f.size.to_le_bytes());
}

/// Reads a model directory and computes its manifest (this reads every byte once).
pub fn manifest(name: &str, dir: &Path) -> Result<Manifest, String> {
    let files = list(dir)?;
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update([0]);
    let mut buf = vec![0u8; 1 << 20];
    for f in &files {
        hash_entry(&mut h, f);
        let mut file = File::open(dir.join(&f.path)).map_err(|e| format!("cannot open {}: {e}", f.path))?;
        let mut seen = 0u64;
        loop {
            let n = file
                .read(&mut buf)
                .map_err(|e| format!("cannot read {}: {e}", f.path))?;
            if n == 0 {
                break;
            }
            seen += n as u64;
            h.update(&buf[..n]);
        }
        if seen != f.size {
            return Err(format!("{} changed while it was read", f.path));
        }
    }
    Ok(Manifest {
        key: hex(&h.finalize()),
        files,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A node's cache of shipped models: `ROOT/KEY/NAME/` holds a complete, verified copy.
#[derive(Debug, Clone)]
pub struct Cache {
    pub root: PathBuf,
}

impl Cache {
    /// The model directory of a key (it exists only when complete).
    pub fn dir(&self, key: &str, name: &str) -> PathBuf {
        self.root.join(key).join(name)
    }

    /// Whether a complete copy of the key is here. A key or name that could not have been
    /// received (see [`Cache::receive`]) is never here, so it never reaches a path.
    pub fn has(&self, key: &str, name: &str) -> bool {
        is_key(key) && is_cache_name(name) && self.dir(key, name).is_dir()
    }

    /// Starts receiving a shipment into a temporary folder of the cache.
    pub fn receive(&self, name: &str, key: &str, files: Vec<FileEntry>, max_total: u64) -> Result<Receiver, String> {
        if !is_key(key) {
            return Err(format!("'{}' is not a shipment key", key.escape_debug()));
        }
        if !is_cache_name(name) {
            return Err(format!(
                "'{}' is not a model name the cache can hold",
                name.escape_debug()
            ));
        }
        if files.len() > MAX_FILES {
            return Err(format!("{} files is more than {MAX_FILES}", files.len()));
        }
        if let Some(bad) = files.iter().find(|f| !safe_path(&f.path)) {
            return Err(format!("refusing file path '{}': not a plain relative path", bad.path));
        }
        let total = files
            .iter()
            .try_fold(0u64, |t, f| t.checked_add(f.size))
            .unwrap_or(u64::MAX);
        if total > max_total {
            return Err(format!(
                "the model's files take {total} bytes, more than this node accepts ({max_total})"
            ));
        }
        std::fs::create_dir_all(&self.root).map_err(|e| format!("cannot create {}: {e}", self.root.display()))?;
        let tmp = self.root.join(format!(".partial-{key}-{:016x}", rand_suffix()));
        let model = tmp.join(name);
        std::fs::create_dir_all(&model).map_err(|e| format!("cannot create {}: {e}", model.display()))?;
        let mut hasher = Sha256::new();
        hasher.update(name.as_bytes());
        hasher.update([0]);
        Ok(Receiver {
            tmp,
            model,
            name: name.to_string(),
            key: key.to_string(),
            final_dir: self.root.join(key),
            files,
            next: 0,
            offset: 0,
            open: None,
            hasher,
        })
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id().into());
    h.finish()
}

/// One shipment being written; dropping it without `finish` removes the partial files.
#[derive(Debug)]
pub struct Receiver {
    tmp: PathBuf,
    model: PathBuf,
    name: String,
    key: String,
    final_dir: PathBuf,
    files: Vec<FileEntry>,
    /// The file being written (files come in order), and how much of it arrived.
    next: usize,
    offset: u64,
    open: Option<File>,
    hasher: Sha256,
}

impl Receiver {
    /// Starts every empty file before `next` non-empty one, and opens the file at `next`.
    fn open_next(&mut self) -> Result<(), String> {
        let f = &self.files[self.next];
        let path = self.model.join(&f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        self.open = Some(File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?);
        hash_entry(&mut self.hasher, f);
        Ok(())
    }

    /// Closes files that are complete (empty ones included) up to the file `upto`.
    fn advance(&mut self, upto: usize) -> Result<(), String> {
        while self.next < upto {
            if self.open.is_none() {
                self.open_next()?;
            }
            if self.offset != self.files[self.next].size {
                return Err(format!(
                    "file '{}' ended at {} of its {} bytes",
                    self.files[self.next].path, self.offset, self.files[self.next].size
                ));
            }
            self.open = None;
            self.next += 1;
            self.offset = 0;
        }
        Ok(())
    }

    /// Takes one chunk; chunks must come in file order and, within a file, in byte order.
    pub fn chunk(&mut self, file: u32, offset: u64, bytes: &[u8]) -> Result<(), String> {
        let file = file as usize;
        if file >= self.files.len() || file < self.next {
            return Err(format!("a chunk of file #{file} arrived out of order"));
        }
        self.advance(file)?;
        if self.open.is_none() {
            self.open_next()?;
        }
        let f = &self.files[file];
        let end = offset.checked_add(bytes.len() as u64);
        if offset != self.offset || end.is_none_or(|e| e > f.size) {
            return Err(format!(
                "a chunk of '{}' at {offset} (+{}) does not continue it at {} of {} bytes",
                f.path,
                bytes.len(),
                self.offset,
                f.size
            ));
        }
        let out = self.open.as_mut().expect("opened above");
        out.write_all(bytes)
            .map_err(|e| format!("cannot write '{}': {e}", f.path))?;
        self.hasher.update(bytes);
        self.offset += bytes.len() as u64;
        Ok(())
    }

    /// Checks that every file arrived whole and the bytes hash to the key, then moves the copy
    /// into place; returns the model directory.
    pub fn finish(mut self) -> Result<PathBuf, String> {
        let n = self.files.len();
        self.advance(n)?;
        let got = hex(&std::mem::take(&mut self.hasher).finalize());
        if got != self.key {
            return Err(format!(
                "the files received hash to {got}, not to the key {} the router placed",
                self.key
            ));
        }
        match std::fs::rename(&self.tmp, &self.final_dir) {
            Ok(()) => {}
            // Another shipment of the same key finished first: its copy is as good.
            Err(_) if self.final_dir.join(&self.name).is_dir() => {}
            Err(e) => return Err(format!("cannot move the model into {}: {e}", self.final_dir.display())),
        }
        Ok(self.final_dir.join(&self.name))
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

fn read_chunk(path: &Path, offset: u64, len: usize) -> Result<Vec<u8>, String> {
    use std::io::{Seek, SeekFrom};
    let mut f = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf)
        .map_err(|e| format!("{} changed while it was sent: {e}", path.display()))?;
    Ok(buf)
}

async fn send_message(
    send: &mut SendStream,
    message: &Message,
    payload: Payload,
    limits: &Limits,
) -> Result<(), FrameError> {
    write_frame(send, frame::encode(message, payload, limits)?).await
}

/// The router's side of a `Fetch`: sends every file of `dir` in chunks, then `FetchEnd`.
pub async fn send_files(
    send: &mut SendStream,
    dir: &Path,
    manifest: &Manifest,
    limits: &Limits,
) -> Result<(), FrameError> {
    let chunk = CHUNK.min(limits.max_payload as usize).max(1);
    for (i, f) in manifest.files.iter().enumerate() {
        let mut offset = 0u64;
        while offset < f.size {
            let len = (f.size - offset).min(chunk as u64) as usize;
            let path = dir.join(&f.path);
            let read = tokio::task::spawn_blocking(move || read_chunk(&path, offset, len))
                .await
                .map_err(|e| FrameError::Io(e.to_string()))?;
            let bytes = match read {
                Ok(b) => b,
                Err(why) => return fetch_error(send, why, limits).await,
            };
            let mut payload = Payload::default();
            payload.push(Bytes::from(bytes));
            let head = Message::FileChunk(FileChunk { file: i as u32, offset });
            send_message(send, &head, payload, limits).await?;
            offset += len as u64;
        }
    }
    send_message(send, &Message::FetchEnd(FetchEnd::Done), Payload::default(), limits).await?;
    let _ = send.finish();
    Ok(())
}

/// Ends a shipment with why it cannot be sent.
pub async fn fetch_error(send: &mut SendStream, why: String, limits: &Limits) -> Result<(), FrameError> {
    let end = FetchEnd::Error(WireError {
        code: super::convert::code_number(crate::Code::Unavailable),
        kind: 0,
        message: why,
    });
    send_message(send, &Message::FetchEnd(end), Payload::default(), limits).await?;
    let _ = send.finish();
    Ok(())
}

/// The node's side: asks the router on `conn` for a model's files and writes them into the cache.
pub async fn fetch(
    conn: &quinn::Connection,
    cache: &Cache,
    model: &str,
    key: &str,
    files: Vec<FileEntry>,
    max_total: u64,
    limits: &Limits,
) -> Result<PathBuf, String> {
    let mut receiver = cache.receive(model, key, files, max_total)?;
    let (mut send, mut recv): (SendStream, RecvStream) = conn
        .open_bi()
        .await
        .map_err(|e| format!("cannot ask the router for the files: {e}"))?;
    let ask = Message::Fetch(Fetch {
        model: model.to_string(),
        key: key.to_string(),
    });
    send_message(&mut send, &ask, Payload::default(), limits)
        .await
        .map_err(|e| format!("cannot ask the router for the files: {e}"))?;
    let _ = send.finish();
    loop {
        let frame = read_frame(&mut recv, limits)
            .await
            .map_err(|e| format!("receiving the files: {e}"))?
            .ok_or("the router ended the shipment before its end")?;
        match frame.message {
            Message::FileChunk(c) => receiver.chunk(c.file, c.offset, &frame.payload)?,
            Message::FetchEnd(FetchEnd::Done) => break,
            Message::FetchEnd(FetchEnd::Error(e)) => {
                return Err(format!("the router cannot send the files: {}", e.message))
            }
            other => {
                let what = super::answer::message_name(&other);
                return Err(format!("a {what} arrived in a shipment of files"));
            }
        }
    }
    tokio::task::spawn_blocking(move || receiver.finish())
        .await
        .map_err(|e| format!("verifying the files: {e}"))?
}

#[cfg(test)]
#[path = "ship_tests.rs"]
mod tests;
