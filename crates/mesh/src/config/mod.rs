//! Model configuration: Triton's `config.pbtxt` text format parsed into our own `ModelConfig` schema.
mod pbtxt;
mod validate;

use std::sync::OnceLock;

use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};

pub use crate::proto::ModelConfig;
pub use pbtxt::{parse_pbtxt, parse_pbtxt_with_fields};
pub use validate::validate_config;

fn descriptor(full_name: &str) -> MessageDescriptor {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(crate::proto::DESCRIPTOR_SET).expect("descriptor set built by build.rs"))
        .get_message_by_name(full_name)
        .expect("message is in the descriptor set")
}

fn model_config_descriptor() -> MessageDescriptor {
    descriptor("inference.ModelConfig")
}

/// Renders a protocol message as Triton's JSON: proto field names, enums by name, 64-bit numbers as numbers.
pub fn message_to_json<M: Message>(msg: &M, full_name: &str) -> serde_json::Value {
    let dynamic = DynamicMessage::decode(descriptor(full_name), msg.encode_to_vec().as_slice())
        .expect("a message always decodes against its own descriptor");
    let options = prost_reflect::SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false)
        .skip_default_fields(false);
    dynamic
        .serialize_with_options(serde_json::value::Serializer, &options)
        .expect("serializing a message into a JSON value cannot fail")
}

/// A config parameter that makes a config override carry only its version policy: the node reads
/// the model's own config as without an override and serves the versions this one names (a router's
/// rollout places a model so, with both versions).
pub const VERSION_POLICY_ONLY: &str = "mesh.version_policy_only";

/// The config as Triton's config endpoint renders it.
pub fn config_to_json(config: &ModelConfig) -> serde_json::Value {
    message_to_json(config, "inference.ModelConfig")
}

/// Instances a config's groups ask for, for footprint estimates: each group's count (at least 1),
/// summed; 1 without groups.
pub fn instance_count(config: &ModelConfig) -> u64 {
    let n: u64 = config
        .instance_group
        .iter()
        .map(|g| u64::try_from(g.count).unwrap_or(0).max(1))
        .sum();
    n.max(1)
}

/// Parses a config given as JSON (the repository extension's `config` override), rejecting unknown fields.
pub fn config_from_json(text: &str) -> Result<ModelConfig, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let options = prost_reflect::DeserializeOptions::new().deny_unknown_fields(true);
    let dynamic = DynamicMessage::deserialize_with_options(model_config_descriptor(), &mut de, &options)
        .map_err(|e| format!("invalid config JSON: {e}"))?;
    dynamic
        .transcode_to::<ModelConfig>()
        .map_err(|e| format!("invalid config JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_uses_triton_field_names_and_plain_numbers() {
        let c = parse_pbtxt(
            "name: \"m\"\nmax_batch_size: 8\ninput [ { name: \"x\" data_type: TYPE_FP32 dims: [ -1, 16 ] } ]",
        )
        .unwrap();
        let j = config_to_json(&c);
        assert_eq!(j["name"], "m");
        assert_eq!(j["max_batch_size"], 8);
        assert_eq!(j["input"][0]["data_type"], "TYPE_FP32");
        assert_eq!(j["input"][0]["dims"], serde_json::json!([-1, 16]));
        assert_eq!(j["input"][0]["optional"], false);
        let back = config_from_json(&j.to_string()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn json_rejects_unknown_fields() {
        let e = config_from_json(r#"{"name":"m","bogus":1}"#).unwrap_err();
        assert!(e.contains("bogus"), "{e}");
    }
}
