//! Fuzzes a cluster-link frame as a peer receives it: the prelude and its limits, the rkyv header
//! (validated), the payload, and the message converted on: requests and answers into the server's
//! tensors (type, shape, range and BYTES checks), a hello's model configs and a statistics reply
//! decoded as protobuf, as the router does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh::cluster::convert;
use mesh::cluster::frame::{self, Limits};
use mesh::cluster::msg::{Message, StatsReply};
use mesh::config::ModelConfig;
use prost::Message as _;

fuzz_target!(|data: &[u8]| {
    static LIMITS: std::sync::OnceLock<Limits> = std::sync::OnceLock::new();
    let limits = LIMITS.get_or_init(Limits::default);
    let Ok(received) = frame::decode_all(data, limits) else {
        return;
    };
    let payload = &received.payload;
    match received.message {
        Message::Request(head) => {
            if let Ok((request, _stream)) = convert::request_from(head, payload) {
                let config = &mesh_fuzz::configs()[0];
                let _ = mesh::validate::check_request(config, &request);
            }
        }
        Message::Answer(answer) => {
            let _ = convert::answer_from(answer.body, payload);
        }
        Message::Hello(hello) => {
            for model in &hello.models {
                if let Ok(config) = ModelConfig::decode(model.config.as_slice()) {
                    let _ = mesh::config::validate_config(&config);
                }
            }
        }
        Message::StatsReply(StatsReply::Stats(bytes)) => {
            let _ = mesh::proto::ModelStatisticsResponse::decode(bytes.as_slice());
        }
        Message::StatsReply(StatsReply::Error(e)) => {
            let _ = convert::error_from(&e);
        }
        _ => {}
    }
});
