//! Triton's restricted APIs: `--http-restricted-api` and `--grpc-restricted-protocol`
//! (`<group>[,<group>...]:<key>=<value>`, repeatable) put groups of endpoints behind a header; a
//! request to a restricted group without the header and value is refused (HTTP 403, gRPC
//! UNAVAILABLE) with the header's name, as Triton does.
use std::collections::BTreeMap;
use std::sync::Arc;

/// Triton's group names, and the mesh's own `cluster` group: a router's operator API (`/mesh/v1`:
/// status, placement, scale, drain).
pub const GROUPS: [&str; 10] = [
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
    "cluster",
];

/// Which groups need which header (key, value).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Restrictions {
    groups: BTreeMap<&'static str, (String, String)>,
}

impl Restrictions {
    /// Parses every flag value; `what` names the flag's kind in errors ("api" or "protocol").
    pub fn parse(values: &[String], what: &str) -> Result<Restrictions, String> {
        let mut groups = BTreeMap::new();
        for value in values {
            let (names, header) = value
                .split_once(':')
                .ok_or_else(|| format!("restricted {what} '{value}' must be <{what}s>:<key>=<value>"))?;
            let (key, expected) = header
                .split_once('=')
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| format!("restricted {what} '{names}' must end with :<key>=<value>"))?;
            // An empty value would let in any request that sends the header empty.
            if expected.is_empty() {
                return Err(format!(
                    "restricted {what} '{names}:{key}=': the value is empty; give it a secret"
                ));
            }
            for name in names.split(',') {
                let group = GROUPS
                    .iter()
                    .find(|g| **g == name)
                    .ok_or_else(|| format!("unknown restricted {what} '{name}'"))?;
                if groups.contains_key(group) {
                    return Err(format!(
                        "{what} '{name}' can not be specified in multiple config groups"
                    ));
                }
                groups.insert(*group, (key.to_ascii_lowercase(), expected.to_string()));
            }
        }
        Ok(Restrictions { groups })
    }

    /// Parses `--grpc-restricted-protocol` values: a rule with key `k` is met by the gRPC metadata
    /// [`GRPC_HEADER_PREFIX`]`k`, as Triton reads it, so the header a request needs is named once.
    pub fn parse_grpc(values: &[String]) -> Result<Restrictions, String> {
        let mut rules = Self::parse(values, "protocol")?;
        for (key, _) in rules.groups.values_mut() {
            key.insert_str(0, GRPC_HEADER_PREFIX);
        }
        Ok(rules)
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The header (key, value) a request to `group` must carry, when the group is restricted: a
    /// follower router adds it to what it forwards to the leader.
    pub fn header(&self, group: &str) -> Option<(&str, &str)> {
        self.groups.get(group).map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// None when a request to `group` with these headers may go on; else the header it lacks.
    pub fn refuses(&self, group: &str, header: impl Fn(&str) -> Option<String>) -> Option<String> {
        let (key, expected) = self.groups.get(group)?;
        (header(key).as_deref() != Some(expected.as_str())).then(|| key.clone())
    }
}

/// The group of an HTTP request, by its path.
pub fn http_group(path: &str) -> Option<&'static str> {
    if path == "/mesh/v1" || path.starts_with("/mesh/v1/") {
        return Some("cluster");
    }
    let rest = path.strip_prefix("/v2")?;
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    Some(match parts.as_slice() {
        [] => "metadata",
        ["health", ..] => "health",
        ["logging", ..] => "logging",
        ["trace", ..] => "trace",
        ["repository", ..] => "model-repository",
        ["systemsharedmemory", ..] | ["cudasharedmemory", ..] => "shared-memory",
        ["models", "stats"] => "statistics",
        ["models", _, tail @ ..] => {
            let tail = match tail {
                ["versions", _, more @ ..] => more,
                other => other,
            };
            match tail {
                [] => "metadata",
                ["ready"] => "health",
                ["config"] => "model-config",
                ["stats"] => "statistics",
                ["infer"] | ["generate"] | ["generate_stream"] => "inference",
                ["trace", ..] => "trace",
                _ => return None,
            }
        }
        _ => return None,
    })
}

/// The group of a gRPC method (`/inference.GRPCInferenceService/<Method>`).
pub fn grpc_group(path: &str) -> Option<&'static str> {
    let method = path.rsplit('/').next()?;
    Some(match method {
        "ServerLive" | "ServerReady" | "ModelReady" => "health",
        "ServerMetadata" | "ModelMetadata" => "metadata",
        "ModelInfer" | "ModelStreamInfer" => "inference",
        "ModelConfig" => "model-config",
        "ModelStatistics" => "statistics",
        "RepositoryIndex" | "RepositoryModelLoad" | "RepositoryModelUnload" => "model-repository",
        "TraceSetting" => "trace",
        "LogSettings" => "logging",
        m if m.contains("SharedMemory") => "shared-memory",
        _ => return None,
    })
}

/// An axum middleware refusing restricted HTTP requests without their header.
pub async fn http_guard(
    axum::extract::State(rules): axum::extract::State<Arc<Restrictions>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if let Some(group) = http_group(request.uri().path()) {
        let headers = request.headers();
        if let Some(key) = rules.refuses(group, |k| header_text(headers, k)) {
            let body = serde_json::json!({ "error": format!("This API is restricted, expecting header '{key}'") });
            return (axum::http::StatusCode::FORBIDDEN, axum::Json(body)).into_response();
        }
    }
    next.run(request).await
}

fn header_text(headers: &http::HeaderMap, key: &str) -> Option<String> {
    headers.get(key).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// Prefix of the gRPC metadata a restricted protocol group needs, as Triton reads it: a rule with
/// key `k` is met by `triton-grpc-protocol-k` (what `tritonclient` users and PyTriton send).
pub const GRPC_HEADER_PREFIX: &str = "triton-grpc-protocol-";

/// Wraps the gRPC service: a restricted method without its header (gRPC metadata, named by
/// [`Restrictions::parse_grpc`]) is answered UNAVAILABLE naming the header, and never reaches the
/// service.
#[derive(Clone)]
pub struct GrpcGuard<S> {
    pub inner: S,
    pub rules: Arc<Restrictions>,
}

impl<S, B> tower::Service<http::Request<B>> for GrpcGuard<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    // Either the refusal, ready at once, or the service's own future: no allocation per call.
    type Future = futures::future::Either<std::future::Ready<Result<Self::Response, Self::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let refused = (!self.rules.is_empty())
            .then(|| grpc_group(request.uri().path()))
            .flatten()
            .and_then(|group| self.rules.refuses(group, |k| header_text(request.headers(), k)));
        match refused {
            Some(key) => {
                let status =
                    tonic::Status::unavailable(format!("This protocol is restricted, expecting header '{key}'"));
                futures::future::Either::Left(std::future::ready(Ok(status.into_http())))
            }
            None => futures::future::Either::Right(self.inner.call(request)),
        }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for GrpcGuard<S> {
    const NAME: &'static str = S::NAME;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn groups_parse_once_each_and_unknown_ones_are_named() {
        let r = Restrictions::parse(
            &flags(&[
                "model-repository:admin-key=admin:value",
                "inference,metadata:Infer-Key=v1",
            ]),
            "api",
        )
        .unwrap();
        let with = |key: &'static str, value: &'static str| move |k: &str| (k == key).then(|| value.to_string());
        assert_eq!(r.refuses("model-repository", |_| None).as_deref(), Some("admin-key"));
        assert_eq!(
            r.refuses("model-repository", with("admin-key", "admin:value")),
            None,
            "values may hold ':'"
        );
        // Header names are case-insensitive (HTTP and gRPC metadata are lower case).
        assert_eq!(r.refuses("inference", with("infer-key", "v1")), None);
        assert_eq!(
            r.refuses("metadata", with("infer-key", "v2")).as_deref(),
            Some("infer-key")
        );
        assert_eq!(r.refuses("statistics", |_| None), None, "unlisted groups are open");
        let twice = Restrictions::parse(
            &flags(&["model-repository,health:k1=v1", "metadata,health:k2=v2"]),
            "api",
        );
        assert_eq!(
            twice.unwrap_err(),
            "api 'health' can not be specified in multiple config groups"
        );
        let unknown = Restrictions::parse(&flags(&["model-reposit,health:k1=v1"]), "api");
        assert_eq!(unknown.unwrap_err(), "unknown restricted api 'model-reposit'");
        assert!(Restrictions::parse(&flags(&["health"]), "protocol")
            .unwrap_err()
            .contains("<key>=<value>"));
        assert!(Restrictions::parse(&flags(&["health:=v"]), "protocol").is_err());
        let empty = Restrictions::parse(&flags(&["cluster:k="]), "api").unwrap_err();
        assert!(empty.contains("the value is empty"), "{empty}");
        let grpc = Restrictions::parse_grpc(&flags(&["health,inference:Infer-Key=v1"])).unwrap();
        assert_eq!(grpc.header("inference"), Some(("triton-grpc-protocol-infer-key", "v1")));
        assert_eq!(
            grpc.refuses("health", with("infer-key", "v1")).as_deref(),
            Some("triton-grpc-protocol-infer-key"),
            "on gRPC the bare key is not the header Triton reads"
        );
        assert_eq!(
            grpc.refuses("health", with("triton-grpc-protocol-infer-key", "v1")),
            None
        );
        let ops = Restrictions::parse(&flags(&["cluster:Admin-Key=s3"]), "api").unwrap();
        assert_eq!(ops.header("cluster"), Some(("admin-key", "s3")));
        assert_eq!(ops.header("inference"), None);
    }

    #[test]
    fn paths_and_methods_map_to_their_groups() {
        for (path, group) in [
            ("/v2", Some("metadata")),
            ("/v2/health/ready", Some("health")),
            ("/v2/models/m", Some("metadata")),
            ("/v2/models/m/versions/2", Some("metadata")),
            ("/v2/models/m/ready", Some("health")),
            ("/v2/models/m/versions/2/infer", Some("inference")),
            ("/v2/models/m/config", Some("model-config")),
            ("/v2/models/stats", Some("statistics")),
            ("/v2/models/m/stats", Some("statistics")),
            ("/v2/repository/index", Some("model-repository")),
            ("/v2/repository/models/m/load", Some("model-repository")),
            ("/v2/systemsharedmemory/status", Some("shared-memory")),
            ("/v2/logging", Some("logging")),
            ("/mesh/v1/cluster", Some("cluster")),
            ("/mesh/v1/models/m/scale", Some("cluster")),
            ("/mesh/v1/nodes/n/drain", Some("cluster")),
            ("/mesh/v1x", None),
            ("/metrics", None),
        ] {
            assert_eq!(http_group(path), group, "{path}");
        }
        assert_eq!(
            grpc_group("/inference.GRPCInferenceService/ModelInfer"),
            Some("inference")
        );
        assert_eq!(
            grpc_group("/inference.GRPCInferenceService/RepositoryModelLoad"),
            Some("model-repository")
        );
        assert_eq!(
            grpc_group("/inference.GRPCInferenceService/CudaSharedMemoryRegister"),
            Some("shared-memory")
        );
        assert_eq!(
            grpc_group("/inference.GRPCInferenceService/LogSettings"),
            Some("logging")
        );
        assert_eq!(grpc_group("/grpc.health.v1.Health/Check"), None);
    }
}
