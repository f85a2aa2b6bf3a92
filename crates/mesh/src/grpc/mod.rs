//! KServe v2 gRPC frontend (`inference.GRPCInferenceService`), generic over `Dispatch`.
pub mod codec;
mod shm;
mod stream;

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::config::ModelConfig;
use crate::dispatch::Dispatch;
use crate::metadata::ModelMetadata;
use crate::proto::{self, grpc_inference_service_server::GrpcInferenceService};
use crate::shm::SharedMemory;

pub use proto::grpc_inference_service_server::GrpcInferenceServiceServer;

/// The gRPC service over a dispatcher.
pub struct GrpcFrontend<D> {
    dispatch: Arc<D>,
    shm: Arc<SharedMemory>,
    /// Metadata whose key matches becomes request parameters (`--grpc-header-forward-pattern`).
    forward: Option<Arc<regex::Regex>>,
}

impl<D: Dispatch> GrpcFrontend<D> {
    /// Wraps the service with message limits matching the HTTP body limit; `shm` is the server's
    /// shared-memory registry (the HTTP frontend's too); metadata matching `forward` becomes
    /// request parameters.
    pub fn server(
        dispatch: Arc<D>,
        max_message_size: usize,
        shm: Arc<SharedMemory>,
        forward: Option<regex::Regex>,
        compress: bool,
    ) -> GrpcInferenceServiceServer<Self> {
        let forward = forward.map(Arc::new);
        let server = GrpcInferenceServiceServer::new(GrpcFrontend { dispatch, shm, forward })
            .max_decoding_message_size(max_message_size)
            .max_encoding_message_size(usize::MAX)
            // Compressed requests are always taken, as Triton takes them.
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
        if compress {
            // Only clients that list gzip in grpc-accept-encoding get gzipped answers.
            server.send_compressed(tonic::codec::CompressionEncoding::Gzip)
        } else {
            server
        }
    }
}

#[tonic::async_trait]
impl<D: Dispatch> GrpcInferenceService for GrpcFrontend<D> {
    async fn server_live(
        &self,
        _: Request<proto::ServerLiveRequest>,
    ) -> Result<Response<proto::ServerLiveResponse>, Status> {
        Ok(Response::new(proto::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<proto::ServerReadyRequest>,
    ) -> Result<Response<proto::ServerReadyResponse>, Status> {
        Ok(Response::new(proto::ServerReadyResponse {
            ready: self.dispatch.ready(),
        }))
    }

    async fn model_ready(
        &self,
        r: Request<proto::ModelReadyRequest>,
    ) -> Result<Response<proto::ModelReadyResponse>, Status> {
        let r = r.into_inner();
        let ready = self
            .dispatch
            .model(&r.name, &r.version)
            .map(|v| v.ready)
            .unwrap_or(false);
        Ok(Response::new(proto::ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<proto::ServerMetadataRequest>,
    ) -> Result<Response<proto::ServerMetadataResponse>, Status> {
        Ok(Response::new(proto::ServerMetadataResponse {
            name: crate::server_name().into(),
            version: crate::SERVER_VERSION.into(),
            extensions: self.dispatch.extensions().into_iter().map(String::from).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        r: Request<proto::ModelMetadataRequest>,
    ) -> Result<Response<proto::ModelMetadataResponse>, Status> {
        let r = r.into_inner();
        let m = ModelMetadata::from_view(&self.dispatch.model(&r.name, &r.version)?);
        let tensors = |ts: Vec<crate::metadata::TensorMetadata>| {
            ts.into_iter()
                .map(|t| proto::model_metadata_response::TensorMetadata {
                    name: t.name,
                    datatype: t.datatype,
                    shape: t.shape,
                })
                .collect()
        };
        Ok(Response::new(proto::ModelMetadataResponse {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: tensors(m.inputs),
            outputs: tensors(m.outputs),
        }))
    }

    async fn model_infer(
        &self,
        r: Request<proto::ModelInferRequest>,
    ) -> Result<Response<proto::ModelInferResponse>, Status> {
        use crate::trace::front::{self, Frontend, Point};
        let received = std::time::Instant::now();
        let client = r
            .remote_addr()
            .map_or(crate::request::Client::Local, crate::request::Client::Connection);
        let (metadata, _, msg) = r.into_parts();
        // The name and the client's trace context are copied (for the trace) only while anything traces.
        let model = front::active().then(|| msg.model_name.clone());
        let carrier = model.as_ref().and_then(|_| codec::trace_carrier(&metadata));
        let served = async {
            let (mut request, in_use) = codec::decode_request(msg, &self.shm)?;
            if let Some(pattern) = &self.forward {
                codec::forward_metadata(pattern, &metadata, &mut request.parameters);
            }
            request.client = client;
            front::stamp(Point::RecvEnd);
            let response = self.dispatch.infer(request).await?;
            front::stamp(Point::SendStart);
            Ok(Response::new(codec::encode_response(response, &in_use)?))
        };
        crate::busy::around(front::serve(
            Frontend::Grpc,
            model.as_deref(),
            received,
            carrier,
            served,
        ))
        .await
    }

    type ModelStreamInferStream = stream::Answers;

    /// Each request of the stream runs as soon as the one before is queued at its model (they
    /// overlap, and join batches in stream order, as Triton's do). Answers of models that
    /// are not decoupled, or errors in `error_message`, go out in request order, as Triton sends
    /// them; a decoupled model's answers (zero or more) go out when ready. Each carries the
    /// request's id. A client that half-closes still gets every answer; one that cancels stops
    /// the requests still running (a decoupled model sees `is_cancelled()`).
    async fn model_stream_infer(
        &self,
        r: Request<tonic::Streaming<proto::ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        let (dispatch, shm, forward) = (self.dispatch.clone(), self.shm.clone(), self.forward.clone());
        Ok(Response::new(stream::serve(dispatch, shm, forward, r)))
    }

    async fn model_config(
        &self,
        r: Request<proto::ModelConfigRequest>,
    ) -> Result<Response<proto::ModelConfigResponse>, Status> {
        let r = r.into_inner();
        let view = self.dispatch.model(&r.name, &r.version)?;
        let config: ModelConfig = (*view.config).clone();
        Ok(Response::new(proto::ModelConfigResponse { config: Some(config) }))
    }

    async fn model_statistics(
        &self,
        r: Request<proto::ModelStatisticsRequest>,
    ) -> Result<Response<proto::ModelStatisticsResponse>, Status> {
        let r = r.into_inner();
        Ok(Response::new(
            self.dispatch.model_statistics(&r.name, &r.version).await?,
        ))
    }

    async fn repository_index(
        &self,
        r: Request<proto::RepositoryIndexRequest>,
    ) -> Result<Response<proto::RepositoryIndexResponse>, Status> {
        let ready_only = r.into_inner().ready;
        let models = self
            .dispatch
            .repository_index()
            .into_iter()
            .filter(|e| !ready_only || e.state == "READY")
            .map(|e| proto::repository_index_response::ModelIndex {
                name: e.name,
                version: e.version,
                state: e.state,
                reason: e.reason,
            })
            .collect();
        Ok(Response::new(proto::RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        r: Request<proto::RepositoryModelLoadRequest>,
    ) -> Result<Response<proto::RepositoryModelLoadResponse>, Status> {
        let r = r.into_inner();
        let options = codec::load_options(r.parameters)?;
        self.dispatch.load_model(&r.model_name, options).await?;
        Ok(Response::new(proto::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        r: Request<proto::RepositoryModelUnloadRequest>,
    ) -> Result<Response<proto::RepositoryModelUnloadResponse>, Status> {
        let r = r.into_inner();
        let dependents = matches!(
            r.parameters
                .get("unload_dependents")
                .and_then(|p| p.parameter_choice.as_ref()),
            Some(proto::model_repository_parameter::ParameterChoice::BoolParam(true))
        );
        self.dispatch.unload_model(&r.model_name, dependents).await?;
        Ok(Response::new(proto::RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        r: Request<proto::SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<proto::SystemSharedMemoryStatusResponse>, Status> {
        Ok(Response::new(shm::system_status(&self.shm, &r.into_inner().name)?))
    }

    async fn system_shared_memory_register(
        &self,
        r: Request<proto::SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<proto::SystemSharedMemoryRegisterResponse>, Status> {
        shm::system_register(&self.shm, r.into_inner())?;
        Ok(Response::new(proto::SystemSharedMemoryRegisterResponse {}))
    }

    async fn system_shared_memory_unregister(
        &self,
        r: Request<proto::SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<proto::SystemSharedMemoryUnregisterResponse>, Status> {
        self.shm.unregister_system(&r.into_inner().name)?;
        Ok(Response::new(proto::SystemSharedMemoryUnregisterResponse {}))
    }

    async fn cuda_shared_memory_status(
        &self,
        r: Request<proto::CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<proto::CudaSharedMemoryStatusResponse>, Status> {
        Ok(Response::new(shm::cuda_status(&self.shm, &r.into_inner().name)?))
    }

    async fn cuda_shared_memory_register(
        &self,
        r: Request<proto::CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<proto::CudaSharedMemoryRegisterResponse>, Status> {
        shm::cuda_register(&self.shm, r.into_inner())?;
        Ok(Response::new(proto::CudaSharedMemoryRegisterResponse {}))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        r: Request<proto::CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<proto::CudaSharedMemoryUnregisterResponse>, Status> {
        self.shm.unregister_cuda(&r.into_inner().name)?;
        Ok(Response::new(proto::CudaSharedMemoryUnregisterResponse {}))
    }

    /// The trace extension: the server's settings (or a model's, over them), changed first when
    /// the request names any (an empty value list clears one).
    async fn trace_setting(
        &self,
        r: Request<proto::TraceSettingRequest>,
    ) -> Result<Response<proto::TraceSettingResponse>, Status> {
        let r = r.into_inner();
        let model = (!r.model_name.is_empty()).then_some(r.model_name.as_str());
        if let Some(m) = model {
            crate::trace::known_model(&*self.dispatch, m)?;
        }
        let changes: Vec<crate::trace::Change> = r
            .settings
            .into_iter()
            .map(|(k, v)| (k, (!v.value.is_empty()).then_some(v.value)))
            .collect();
        let settings = match changes.is_empty() {
            true => crate::trace::tracer().settings(model),
            false => crate::trace::update(model, &changes)?,
        };
        let settings = settings
            .pairs()
            .into_iter()
            .map(|(k, value)| (k, proto::trace_setting_response::SettingValue { value }))
            .collect();
        Ok(Response::new(proto::TraceSettingResponse { settings }))
    }

    async fn log_settings(
        &self,
        request: Request<proto::LogSettingsRequest>,
    ) -> Result<Response<proto::LogSettingsResponse>, Status> {
        use crate::logging::SettingValue;
        use proto::log_settings_request::setting_value::ParameterChoice as In;
        use proto::log_settings_response::{setting_value::ParameterChoice as Out, SettingValue as OutValue};
        let changes: Vec<(String, SettingValue)> = request
            .into_inner()
            .settings
            .into_iter()
            .map(|(k, v)| {
                let value = match v.parameter_choice {
                    Some(In::BoolParam(b)) => SettingValue::Bool(b),
                    Some(In::Uint32Param(n)) => SettingValue::Uint(u64::from(n)),
                    Some(In::StringParam(s)) => SettingValue::Str(s),
                    None => SettingValue::Str(String::new()),
                };
                (k, value)
            })
            .collect();
        let s = if changes.is_empty() {
            crate::logging::settings()
        } else {
            crate::logging::update(&changes)?
        };
        let value = |c| OutValue {
            parameter_choice: Some(c),
        };
        let settings = [
            ("log_file", value(Out::StringParam(s.log_file))),
            ("log_info", value(Out::BoolParam(s.log_info))),
            ("log_warning", value(Out::BoolParam(s.log_warning))),
            ("log_error", value(Out::BoolParam(s.log_error))),
            ("log_verbose_level", value(Out::Uint32Param(s.log_verbose_level))),
            ("log_format", value(Out::StringParam(s.log_format))),
        ];
        Ok(Response::new(proto::LogSettingsResponse {
            settings: settings.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }))
    }
}
