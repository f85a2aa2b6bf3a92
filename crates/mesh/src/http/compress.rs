//! gzip/deflate for request and response bodies, with decompression capped to stop zip bombs.
use std::io::{Read, Write};

use axum::http::HeaderValue;
use bytes::Bytes;

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Encoding {
    Gzip,
    Deflate,
}

impl Encoding {
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Gzip => "gzip",
            Encoding::Deflate => "deflate",
        }
    }
}

/// Decompresses a body per its Content-Encoding, refusing output larger than `limit`.
pub fn decode(content_encoding: Option<&HeaderValue>, body: Bytes, limit: usize) -> Result<Bytes> {
    let enc = match content_encoding.map(|v| v.to_str().unwrap_or("").trim().to_ascii_lowercase()) {
        None => return Ok(body),
        Some(e) if e.is_empty() || e == "identity" => return Ok(body),
        Some(e) if e == "gzip" => Encoding::Gzip,
        Some(e) if e == "deflate" => Encoding::Deflate,
        Some(e) => {
            return Err(Error::invalid(format!(
                "unsupported Content-Encoding '{e}'; use gzip, deflate or identity"
            )))
        }
    };
    let reader: Box<dyn Read + '_> = match enc {
        Encoding::Gzip => Box::new(flate2::read::GzDecoder::new(&body[..])),
        Encoding::Deflate => Box::new(flate2::read::ZlibDecoder::new(&body[..])),
    };
    let mut out = Vec::new();
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| Error::invalid(format!("failed to decompress the {} request body: {e}", enc.name())))?;
    if out.len() > limit {
        return Err(super::too_large(limit));
    }
    Ok(Bytes::from(out))
}

/// Picks a response encoding the client accepts, gzip first.
pub fn choose(accept: Option<&HeaderValue>) -> Option<Encoding> {
    let accept = accept?.to_str().ok()?.to_ascii_lowercase();
    let offers = |name: &str| {
        accept.split(',').any(|part| {
            let mut it = part.split(';');
            let token = it.next().unwrap_or("").trim();
            let q_zero = it.any(|p| p.trim().replace(' ', "") == "q=0");
            token == name && !q_zero
        })
    };
    if offers("gzip") {
        Some(Encoding::Gzip)
    } else if offers("deflate") {
        Some(Encoding::Deflate)
    } else {
        None
    }
}

pub fn encode(enc: Encoding, data: &[u8]) -> Result<Bytes> {
    let level = flate2::Compression::fast();
    let out = match enc {
        Encoding::Gzip => {
            let mut w = flate2::write::GzEncoder::new(Vec::new(), level);
            w.write_all(data).and_then(|_| w.finish())
        }
        Encoding::Deflate => {
            let mut w = flate2::write::ZlibEncoder::new(Vec::new(), level);
            w.write_all(data).and_then(|_| w.finish())
        }
    };
    out.map(Bytes::from)
        .map_err(|e| Error::internal(format!("compressing the response: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_bomb_limit() {
        let data = vec![7u8; 10_000];
        for enc in [Encoding::Gzip, Encoding::Deflate] {
            let c = encode(enc, &data).unwrap();
            let hv = HeaderValue::from_static(enc.name());
            assert_eq!(decode(Some(&hv), c.clone(), 20_000).unwrap(), data);
            let e = decode(Some(&hv), c, 100).unwrap_err();
            assert!(e.message.contains("larger than the limit"), "{e}");
        }
        let bad = HeaderValue::from_static("gzip");
        assert!(decode(Some(&bad), Bytes::from_static(b"nope"), 100)
            .unwrap_err()
            .message
            .contains("decompress"));
        let br = HeaderValue::from_static("br");
        assert!(decode(Some(&br), Bytes::new(), 100).is_err());
    }

    #[test]
    fn chooses_accepted_encoding() {
        assert_eq!(
            choose(Some(&HeaderValue::from_static("deflate, gzip"))),
            Some(Encoding::Gzip)
        );
        assert_eq!(
            choose(Some(&HeaderValue::from_static("deflate"))),
            Some(Encoding::Deflate)
        );
        assert_eq!(choose(Some(&HeaderValue::from_static("gzip;q=0"))), None);
        assert_eq!(choose(None), None);
    }
}
