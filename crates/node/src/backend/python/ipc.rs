//! The stub link's wire format: length-prefixed JSON frames over a Unix socket, and tensor bytes in
//! a shared-memory file split in two halves (the node writes the first, the stub the second).
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use memmap2::MmapMut;
use mesh::{DataType, Error, NamedTensor, Result, Tensor};
use serde_json::{json, Value};

/// Allocations in shared memory start on this boundary, so numpy and ORT get aligned views.
const ALIGN: usize = 64;
/// A frame header (JSON) larger than this is a broken stub, not a real message.
const MAX_HEADER: usize = 64 << 20;
/// Tensor bytes sent inside a frame (when shared memory is full) are capped at this.
pub const MAX_BLOB: usize = 1 << 30;

/// A shared-memory file mapped by the node and one stub; removed from the file system once the
/// stub has mapped it, so nothing is left behind if either side dies.
pub struct Shm {
    map: MmapMut,
    ptr: *mut u8,
    len: usize,
    next: AtomicUsize,
    path: std::sync::Mutex<Option<PathBuf>>,
}

// SAFETY: writes go only to ranges handed out once by `alloc` (disjoint), and reads of the stub's
// half happen only for ranges the stub has finished writing (it answered before we read).
unsafe impl Send for Shm {}
// SAFETY: as for Send: shared use touches disjoint ranges, and `next` and `path` synchronise themselves.
unsafe impl Sync for Shm {}

impl Shm {
    pub fn create(path: &Path, len: usize) -> io::Result<Shm> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        file.set_len(len as u64)?;
        // SAFETY: the file is ours and sized; only this process and its stub map it.
        let mut map = unsafe { MmapMut::map_mut(&file)? };
        let ptr = map.as_mut_ptr();
        Ok(Shm {
            map,
            ptr,
            len,
            next: AtomicUsize::new(0),
            path: std::sync::Mutex::new(Some(path.to_path_buf())),
        })
    }

    /// Removes the file name once the stub has mapped it; both mappings stay valid.
    pub fn unlink_once(&self) {
        if let Some(p) = self.path.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Starts the node's half afresh (before each execute).
    pub fn reset(&self) {
        self.next.store(0, Ordering::Release);
    }

    /// Reserves `n` bytes in the node's half; None when it is full.
    fn alloc(&self, n: usize) -> Option<usize> {
        let half = self.len / 2;
        let mut cur = self.next.load(Ordering::Acquire);
        loop {
            let start = cur.div_ceil(ALIGN) * ALIGN;
            let end = start.checked_add(n).filter(|&e| e <= half)?;
            match self
                .next
                .compare_exchange(cur, end, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(start),
                Err(now) => cur = now,
            }
        }
    }

    /// Reserves `n` zeroed flag bytes in the node's half (cancellation flags the stub polls).
    pub fn alloc_flags(&self, n: usize) -> Option<usize> {
        let off = self.alloc(n)?;
        self.write(off, &vec![0u8; n]);
        Some(off)
    }

    /// Raises one flag byte reserved by `alloc_flags`.
    pub fn raise_flag(&self, off: usize) {
        assert!(off < self.len / 2, "flag outside the node's half");
        // SAFETY: in the mapping (checked above); a single byte, read by the stub with no ordering needs.
        unsafe { std::ptr::write_volatile(self.ptr.add(off), 1) }
    }

    fn write(&self, off: usize, bytes: &[u8]) {
        debug_assert!(off + bytes.len() <= self.len / 2);
        // SAFETY: [off, off+len) was reserved by `alloc` for this write alone and lies in the mapping.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(off), bytes.len()) }
    }

    /// A range the stub wrote; offsets come from the stub, so they are checked.
    fn read(&self, off: usize, n: usize) -> Result<&[u8]> {
        let end = off.checked_add(n).filter(|&e| e <= self.len);
        end.map(|e| &self.map[off..e]).ok_or_else(|| {
            Error::internal(format!(
                "stub named shared memory [{off}, +{n}) outside its {} bytes",
                self.len
            ))
        })
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        self.unlink_once();
    }
}

/// Writes one frame: u32 header length, u32 blob length, the JSON header, the blob.
pub fn write_frame(w: &mut impl Write, header: &Value, blob: &[u8]) -> io::Result<()> {
    let head = serde_json::to_vec(header).map_err(io::Error::other)?;
    let mut buf = Vec::with_capacity(8 + head.len() + blob.len());
    buf.extend_from_slice(&(head.len() as u32).to_le_bytes());
    buf.extend_from_slice(&(blob.len() as u32).to_le_bytes());
    buf.extend_from_slice(&head);
    buf.extend_from_slice(blob);
    w.write_all(&buf)
}

/// Reads one frame; sizes come from the stub, so they are capped before anything is allocated.
pub fn read_frame(r: &mut impl Read) -> io::Result<(Value, Vec<u8>)> {
    let mut prefix = [0u8; 8];
    r.read_exact(&mut prefix)?;
    let head_len = u32::from_le_bytes(prefix[..4].try_into().expect("4 bytes")) as usize;
    let blob_len = u32::from_le_bytes(prefix[4..].try_into().expect("4 bytes")) as usize;
    if head_len > MAX_HEADER || blob_len > MAX_BLOB {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("stub frame too large ({head_len} + {blob_len} bytes)"),
        ));
    }
    let mut head = vec![0u8; head_len];
    r.read_exact(&mut head)?;
    let mut blob = vec![0u8; blob_len];
    r.read_exact(&mut blob)?;
    let header = serde_json::from_slice(&head).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok((header, blob))
}

/// Puts a tensor in the node's half of shared memory (or in `blob` when it is full) and describes it.
pub fn encode_tensor(shm: &Shm, t: &NamedTensor, blob: &mut Vec<u8>) -> Value {
    let data = &t.tensor.data;
    let mut desc = json!({
        "name": t.name,
        "datatype": t.tensor.dtype.wire_name(),
        "shape": t.tensor.shape,
    });
    match shm.alloc(data.len()) {
        Some(off) => {
            shm.write(off, data);
            desc["shm"] = json!([off, data.len()]);
        }
        None => {
            desc["inline"] = json!([blob.len(), data.len()]);
            blob.extend_from_slice(data);
        }
    }
    desc
}

/// Reads a tensor the stub described; everything in the description is checked.
pub fn decode_tensor(shm: &Shm, desc: &Value, blob: &[u8]) -> Result<NamedTensor> {
    let bad = |what: &str| Error::internal(format!("stub sent a malformed tensor ({what}): {desc}"));
    let name = desc["name"].as_str().ok_or_else(|| bad("name"))?.to_string();
    let dtype = DataType::from_wire(desc["datatype"].as_str().ok_or_else(|| bad("datatype"))?)?;
    let shape: Vec<i64> = desc["shape"]
        .as_array()
        .ok_or_else(|| bad("shape"))?
        .iter()
        .map(|d| d.as_i64().filter(|&d| d >= 0))
        .collect::<Option<_>>()
        .ok_or_else(|| bad("shape"))?;
    let range = |v: &Value| -> Option<(usize, usize)> {
        let a = v.as_array()?;
        Some((a.first()?.as_u64()? as usize, a.get(1)?.as_u64()? as usize))
    };
    let bytes = if let Some((off, n)) = range(&desc["shm"]) {
        shm.read(off, n)?
    } else if let Some((off, n)) = range(&desc["inline"]) {
        off.checked_add(n)
            .and_then(|end| blob.get(off..end))
            .ok_or_else(|| bad("inline range"))?
    } else {
        return Err(bad("location"));
    };
    let tensor = Tensor::new(dtype, shape, Bytes::copy_from_slice(bytes))
        .map_err(|e| Error::internal(format!("stub output '{name}': {}", e.message)))?;
    Ok(NamedTensor { name, tensor })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shm(len: usize) -> Shm {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("mesh-ipc-test-{}-{n}", std::process::id()));
        Shm::create(&path, len).unwrap()
    }

    #[test]
    fn frames_round_trip_and_oversized_ones_are_refused() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &json!({"op": "x"}), b"abc").unwrap();
        let (h, b) = read_frame(&mut buf.as_slice()).unwrap();
        assert_eq!(h["op"], "x");
        assert_eq!(b, b"abc");
        let mut huge = Vec::new();
        huge.extend_from_slice(&8u32.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        let err = read_frame(&mut huge.as_slice()).unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
    }

    #[test]
    fn tensors_go_to_shared_memory_then_inline_when_full() {
        let s = shm(192);
        let t = NamedTensor {
            name: "x".into(),
            tensor: Tensor::from_values(vec![3, 4], &[1.0f32; 12]),
        };
        let mut blob = Vec::new();
        let a = encode_tensor(&s, &t, &mut blob);
        assert!(a.get("shm").is_some() && blob.is_empty());
        let b = encode_tensor(&s, &t, &mut blob);
        assert!(
            b.get("inline").is_some(),
            "the second does not fit in a 96-byte half: {b}"
        );
        assert_eq!(blob.len(), 48);
        for desc in [&a, &b] {
            let back = decode_tensor(&s, desc, &blob).unwrap();
            assert_eq!(back.tensor, t.tensor);
        }
    }

    #[test]
    fn bad_descriptions_are_errors_not_panics() {
        let s = shm(256);
        for desc in [
            json!({"name": "x", "datatype": "FP32", "shape": [1], "shm": [250, 8]}),
            json!({"name": "x", "datatype": "FP32", "shape": [2], "shm": [0, 4]}),
            json!({"name": "x", "datatype": "NOPE", "shape": [1], "shm": [0, 4]}),
            json!({"name": "x", "datatype": "FP32", "shape": [-1], "shm": [0, 4]}),
            json!({"name": "x", "datatype": "FP32", "shape": [1], "inline": [0, 4]}),
            json!({"datatype": "FP32", "shape": [1], "shm": [0, 4]}),
        ] {
            assert!(decode_tensor(&s, &desc, &[]).is_err(), "{desc}");
        }
    }
}
