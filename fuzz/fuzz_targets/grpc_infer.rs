//! Fuzzes a gRPC `ModelInfer` request after tonic hands it over: the protobuf message decoded, then
//! turned into the server's request (raw contents by position, typed contents with their range
//! checks, shared-memory regions), checked against a config, and its inputs echoed through the
//! response encoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh::grpc::codec;
use mesh::proto::ModelInferRequest;
use prost::Message as _;

fuzz_target!(|data: &[u8]| {
    let Ok(message) = ModelInferRequest::decode(data) else {
        return;
    };
    let Ok((request, shm_outputs)) = codec::decode_request(message, mesh_fuzz::shared_memory()) else {
        return;
    };
    let _ = mesh::validate::check_request(&mesh_fuzz::configs()[0], &request);
    let response = mesh_fuzz::echo(request);
    if let Ok(encoded) = codec::encode_response(response, &shm_outputs) {
        let _ = encoded.encode_to_vec();
    }
});
