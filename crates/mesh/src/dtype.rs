//! Triton's 14 tensor data types, with their wire names (KServe v2) and config names (TYPE_*).
use crate::error::Error;
use crate::proto;

/// A tensor element type, named as in the KServe v2 protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Fp32,
    Fp64,
    Bytes,
    Bf16,
}

impl DataType {
    pub const ALL: [DataType; 14] = [
        DataType::Bool,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Fp16,
        DataType::Fp32,
        DataType::Fp64,
        DataType::Bytes,
        DataType::Bf16,
    ];

    /// The KServe v2 name ("FP32", "BYTES", ...).
    pub fn wire_name(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp16 => "FP16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bytes => "BYTES",
            DataType::Bf16 => "BF16",
        }
    }

    /// Parses a KServe v2 datatype name, naming the bad value in the error.
    pub fn from_wire(name: &str) -> Result<Self, Error> {
        DataType::ALL
            .into_iter()
            .find(|d| d.wire_name() == name)
            .ok_or_else(|| Error::invalid(format!("unknown datatype '{name}'")))
    }

    /// Size of one element in bytes; None for variable-size BYTES.
    pub fn element_size(self) -> Option<usize> {
        Some(match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => 1,
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 | DataType::Bf16 => 2,
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => 4,
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => 8,
            DataType::Bytes => return None,
        })
    }

    /// Maps a config `data_type` enum value; None for TYPE_INVALID or unknown numbers.
    pub fn from_config(v: i32) -> Option<Self> {
        use proto::DataType as P;
        Some(match P::try_from(v).ok()? {
            P::TypeInvalid => return None,
            P::TypeBool => DataType::Bool,
            P::TypeUint8 => DataType::Uint8,
            P::TypeUint16 => DataType::Uint16,
            P::TypeUint32 => DataType::Uint32,
            P::TypeUint64 => DataType::Uint64,
            P::TypeInt8 => DataType::Int8,
            P::TypeInt16 => DataType::Int16,
            P::TypeInt32 => DataType::Int32,
            P::TypeInt64 => DataType::Int64,
            P::TypeFp16 => DataType::Fp16,
            P::TypeFp32 => DataType::Fp32,
            P::TypeFp64 => DataType::Fp64,
            P::TypeString => DataType::Bytes,
            P::TypeBf16 => DataType::Bf16,
        })
    }

    /// The config enum value (TYPE_STRING for BYTES, as Triton spells it).
    pub fn to_config(self) -> i32 {
        use proto::DataType as P;
        (match self {
            DataType::Bool => P::TypeBool,
            DataType::Uint8 => P::TypeUint8,
            DataType::Uint16 => P::TypeUint16,
            DataType::Uint32 => P::TypeUint32,
            DataType::Uint64 => P::TypeUint64,
            DataType::Int8 => P::TypeInt8,
            DataType::Int16 => P::TypeInt16,
            DataType::Int32 => P::TypeInt32,
            DataType::Int64 => P::TypeInt64,
            DataType::Fp16 => P::TypeFp16,
            DataType::Fp32 => P::TypeFp32,
            DataType::Fp64 => P::TypeFp64,
            DataType::Bytes => P::TypeString,
            DataType::Bf16 => P::TypeBf16,
        }) as i32
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.wire_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_and_config_names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(DataType::from_wire(d.wire_name()).unwrap(), d);
            assert_eq!(DataType::from_config(d.to_config()), Some(d));
        }
        assert!(DataType::from_wire("FLOAT").is_err());
        assert_eq!(DataType::from_config(0), None);
        assert_eq!(DataType::from_config(99), None);
        assert_eq!(DataType::Bytes.to_config(), proto::DataType::TypeString as i32);
    }
}
