//! KServe v2 over gRPC (the mesh's tonic client): model metadata and config, and inference with raw contents.

use std::sync::Arc;
use std::time::Duration;

use mesh::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use mesh::proto::model_infer_request::InferInputTensor;
use mesh::proto::{ModelConfigRequest, ModelInferRequest, ModelMetadataRequest, ModelMetadataResponse};
use tonic::transport::{Channel, Endpoint};

use super::inputs::{InputSpec, ModelInfo, RequestTensor};
use super::report::{ErrorKind, RequestError};
use super::{describe, SetupError, SetupKind};

type Client = GrpcInferenceServiceClient<Channel>;

/// The server's gRPC address.
#[derive(Debug)]
pub struct Target {
    /// As the user wrote it.
    url: String,
    endpoint: Endpoint,
    /// Bounds the metadata calls (inference is bounded by the caller).
    timeout: Duration,
}

impl Target {
    /// Accepts `HOST:PORT` or `http://HOST:PORT`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, SetupError> {
        let full = crate::http::with_scheme(url);
        if !full.starts_with("http://") {
            return Err(SetupError::usage(format!(
                "--grpc-url {url}: only plain HOST:PORT (or http://HOST:PORT) is supported"
            )));
        }
        let endpoint = Endpoint::from_shared(full)
            .map_err(|e| SetupError::usage(format!("--grpc-url {url}: {}", describe(&e))))?
            .connect_timeout(timeout)
            .tcp_nodelay(true);
        Ok(Target {
            url: url.to_string(),
            endpoint,
            timeout,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// A client on a connection of its own.
    async fn client(&self) -> Result<Client, RequestError> {
        let channel = self
            .endpoint
            .connect()
            .await
            .map_err(|e| RequestError::new(ErrorKind::Connect, describe(&e)))?;
        Ok(GrpcInferenceServiceClient::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX))
    }

    /// Reads the model's inputs (ModelMetadata) and max_batch_size (ModelConfig).
    pub async fn model_info(&self, model: &str, version: Option<&str>) -> Result<ModelInfo, SetupError> {
        tokio::time::timeout(self.timeout, self.fetch_model_info(model, version))
            .await
            .unwrap_or_else(|_| {
                Err(SetupError::new(
                    SetupKind::Unreachable,
                    format!("cannot reach {}: no answer within {:?}", self.url, self.timeout),
                ))
            })
    }

    async fn fetch_model_info(&self, model: &str, version: Option<&str>) -> Result<ModelInfo, SetupError> {
        let mut client = self.client().await.map_err(|e| {
            SetupError::new(
                SetupKind::Unreachable,
                format!("cannot reach {}: {}", self.url, e.message),
            )
        })?;
        let named = match version {
            Some(v) => format!("model '{model}' version {v}"),
            None => format!("model '{model}'"),
        };
        let refused = |what: &str, s: tonic::Status| {
            let kind = match s.code() {
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => SetupKind::Unreachable,
                _ => SetupKind::UnknownModel,
            };
            let code = super::report::grpc_code_name(s.code() as i32);
            SetupError::new(
                kind,
                format!("{named}: {} answered {what} with {code}: {}", self.url, s.message()),
            )
        };
        let metadata = client
            .model_metadata(ModelMetadataRequest {
                name: model.to_string(),
                version: version.unwrap_or_default().to_string(),
            })
            .await
            .map_err(|s| refused("ModelMetadata", s))?
            .into_inner();
        let config = client
            .model_config(ModelConfigRequest {
                name: model.to_string(),
                version: version.unwrap_or_default().to_string(),
            })
            .await
            .map_err(|s| refused("ModelConfig", s))?
            .into_inner();
        let max_batch_size = config.config.map_or(0, |c| c.max_batch_size);
        model_info(metadata, max_batch_size)
            .map_err(|e| SetupError::bad_answer(format!("{}: metadata of {model}: {e}", self.url)))
    }
}

/// The inputs from a ModelMetadata answer with the config's max_batch_size.
pub fn model_info(metadata: ModelMetadataResponse, max_batch_size: i32) -> Result<ModelInfo, String> {
    let max_batch_size =
        u32::try_from(max_batch_size).map_err(|_| format!("config max_batch_size {max_batch_size} is negative"))?;
    let inputs = metadata
        .inputs
        .into_iter()
        .map(|t| InputSpec {
            name: t.name,
            datatype: t.datatype,
            shape: t.shape,
        })
        .collect();
    Ok(ModelInfo { inputs, max_batch_size })
}

/// One ModelInferRequest per request variant, the tensors in `raw_input_contents`.
pub fn prepare(model: &str, version: Option<&str>, variants: &[Vec<RequestTensor>]) -> Vec<ModelInferRequest> {
    variants
        .iter()
        .map(|tensors| ModelInferRequest {
            model_name: model.to_string(),
            model_version: version.unwrap_or_default().to_string(),
            inputs: tensors
                .iter()
                .map(|t| InferInputTensor {
                    name: t.name.clone(),
                    datatype: t.datatype.wire_name().to_string(),
                    shape: t.shape.clone(),
                    ..Default::default()
                })
                .collect(),
            raw_input_contents: tensors.iter().map(|t| t.data.clone()).collect(),
            ..Default::default()
        })
        .collect()
}

/// What a failed call counts as. A status the server sent counts under its code; one the client made
/// up from a failed connection (it carries the failure as its source) counts as `connect` when the
/// connection was refused, else as `disconnected`.
pub fn classify(s: &tonic::Status) -> RequestError {
    let Some(cause) = std::error::Error::source(s) else {
        return RequestError::new(ErrorKind::Grpc(s.code() as i32), s.message().to_string());
    };
    let mut refused = false;
    let mut cur = Some(cause);
    while let Some(e) = cur {
        refused |= e
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused);
        cur = e.source();
    }
    let kind = if refused {
        ErrorKind::Connect
    } else {
        ErrorKind::Disconnected
    };
    let detail = describe(cause);
    let message = if s.message().is_empty() || detail.contains(s.message()) {
        detail
    } else {
        format!("{}: {detail}", s.message())
    };
    RequestError::new(kind, message)
}

/// One connection (an HTTP/2 channel of its own), made again when lost.
pub struct Slot {
    target: Arc<Target>,
    requests: Arc<Vec<ModelInferRequest>>,
    client: Option<Client>,
}

impl Slot {
    pub fn new(target: Arc<Target>, requests: Arc<Vec<ModelInferRequest>>) -> Self {
        Slot {
            target,
            requests,
            client: None,
        }
    }

    pub async fn connect(&mut self) -> Result<(), RequestError> {
        if self.client.is_none() {
            self.client = Some(self.target.client().await?);
        }
        Ok(())
    }

    pub fn reset(&mut self) {
        self.client = None;
    }

    /// Sends request variant `variant` and waits for its answer.
    pub async fn infer(&mut self, variant: usize) -> Result<(), RequestError> {
        self.connect().await?;
        let client = self.client.as_mut().expect("connected above");
        match client.model_infer(self.requests[variant].clone()).await {
            Ok(_) => Ok(()),
            Err(s) => {
                let e = classify(&s);
                if !matches!(e.kind, ErrorKind::Grpc(_)) {
                    // The channel broke: dial again for the next request.
                    self.client = None;
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh::proto::model_metadata_response::TensorMetadata;

    #[test]
    fn statuses_are_counted_by_code_name() {
        let e = classify(&tonic::Status::unavailable("busy"));
        assert_eq!(
            (e.kind, e.kind.to_string(), e.message.as_str()),
            (ErrorKind::Grpc(14), "UNAVAILABLE".into(), "busy")
        );
        assert_eq!(
            classify(&tonic::Status::invalid_argument("x")).kind.to_string(),
            "INVALID_ARGUMENT"
        );
        assert_eq!(
            classify(&tonic::Status::deadline_exceeded("x")).kind.to_string(),
            "DEADLINE_EXCEEDED"
        );
        // Statuses the client makes up from a failed connection carry the failure as their source.
        let io = |kind: std::io::ErrorKind| tonic::Status::from_error(Box::new(std::io::Error::from(kind)));
        let refused = classify(&io(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(
            (refused.kind, refused.message.as_str()),
            (ErrorKind::Connect, "connection refused")
        );
        assert_eq!(
            classify(&io(std::io::ErrorKind::ConnectionReset)).kind,
            ErrorKind::Disconnected
        );
    }

    #[test]
    fn requests_carry_raw_contents_and_metadata_maps_to_inputs() {
        let t = RequestTensor {
            name: "x".into(),
            datatype: mesh::DataType::Bytes,
            shape: vec![1],
            data: bytes::Bytes::from_static(b"\x02\0\0\0hi"),
        };
        let reqs = prepare("m", Some("3"), &[vec![t]]);
        assert_eq!(
            (reqs[0].model_name.as_str(), reqs[0].model_version.as_str()),
            ("m", "3")
        );
        assert_eq!(reqs[0].inputs[0].datatype, "BYTES");
        assert_eq!(&reqs[0].raw_input_contents[0][..], b"\x02\0\0\0hi");
        let md = ModelMetadataResponse {
            inputs: vec![TensorMetadata {
                name: "x".into(),
                datatype: "INT64".into(),
                shape: vec![-1, 4],
            }],
            ..Default::default()
        };
        let info = model_info(md.clone(), 8).unwrap();
        assert_eq!((info.max_batch_size, info.inputs[0].shape.clone()), (8, vec![-1, 4]));
        assert!(model_info(md, -1).is_err());
    }

    #[test]
    fn urls_take_host_port_or_http() {
        assert!(Target::new("localhost:8001", Duration::from_secs(1)).is_ok());
        assert!(Target::new("http://localhost:8001", Duration::from_secs(1)).is_ok());
        assert_eq!(
            Target::new("https://localhost:8001", Duration::from_secs(1))
                .unwrap_err()
                .kind,
            SetupKind::Usage
        );
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_address() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let target = Target::new(&format!("127.0.0.1:{port}"), Duration::from_secs(5)).unwrap();
        let err = target.model_info("m", None).await.unwrap_err();
        assert_eq!(err.kind, SetupKind::Unreachable);
        assert!(
            err.message.starts_with(&format!("cannot reach 127.0.0.1:{port}: ")),
            "{}",
            err.message
        );
        assert!(err.message.contains("connection refused"), "{}", err.message);
    }
}
