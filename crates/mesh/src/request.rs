//! Inference requests and responses as every frontend, dispatcher and backend sees them.
use crate::tensor::NamedTensor;

/// A request or response parameter value (KServe v2 `parameters`).
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    String(String),
}

impl Param {
    /// Reads the value as an unsigned integer where it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Param::Int(v) => u64::try_from(v).ok(),
            Param::Uint(v) => Some(v),
            _ => None,
        }
    }
}

/// Ordered name → value parameters.
pub type Params = Vec<(String, Param)>;

/// An output the client asked for by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestedOutput {
    pub name: String,
    /// The classification extension: answer the top this many classes (see `classify`).
    pub class_count: Option<u32>,
}

impl RequestedOutput {
    pub fn named(name: impl Into<String>) -> Self {
        RequestedOutput {
            name: name.into(),
            class_count: None,
        }
    }

    /// The class count an output request's parameters ask for (`classification`), if any.
    pub fn class_count_in(output: &str, params: &Params) -> crate::Result<Option<u32>> {
        match params.iter().find(|(k, _)| k == "classification") {
            Some((_, v)) => Self::class_count_of(output, v).map(Some),
            None => Ok(None),
        }
    }

    /// Reads the `classification` parameter of an output request (a positive class count).
    fn class_count_of(output: &str, value: &Param) -> crate::Result<u32> {
        let n = match value {
            Param::Int(i) => u32::try_from(*i).ok(),
            Param::Uint(u) => u32::try_from(*u).ok(),
            _ => None,
        };
        n.filter(|n| *n > 0).ok_or_else(|| {
            crate::Error::invalid(format!(
                "output '{output}': 'classification' must be a positive integer class count, got {value:?}"
            ))
        })
    }
}

/// Who sent a request, so that a server shares itself fairly between its clients
/// (the in-flight budget). Never on the wire: each server sets it from where the request came in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Client {
    /// In-process: the embedding APIs, and requests a model makes itself (BLS).
    #[default]
    Local,
    /// A connection to the HTTP or gRPC port, by its peer's address.
    Connection(std::net::SocketAddr),
    /// A router's cluster link, by its number on this node.
    Link(u64),
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Client::Local => write!(f, "an in-process caller"),
            Client::Connection(peer) => write!(f, "client {peer}"),
            Client::Link(n) => write!(f, "cluster link {n}"),
        }
    }
}

/// One inference request, decoded from HTTP, gRPC or the cluster link.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InferRequest {
    pub model_name: String,
    /// Empty means "the version the policy picks" (the highest ready one).
    pub model_version: String,
    pub id: String,
    pub inputs: Vec<NamedTensor>,
    /// Empty means "every output of the model".
    pub outputs: Vec<RequestedOutput>,
    pub parameters: Params,
    /// Who sent it (set by the server that received it; never sent on).
    pub client: Client,
}

impl InferRequest {
    pub fn input(&self, name: &str) -> Option<&NamedTensor> {
        self.inputs.iter().find(|t| t.name == name)
    }
}

/// One inference response.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InferResponse {
    pub model_name: String,
    pub model_version: String,
    pub id: String,
    pub outputs: Vec<NamedTensor>,
    pub parameters: Params,
}
