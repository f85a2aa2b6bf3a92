//! The messages of the cluster link, archived with rkyv as each frame's header (tensor bytes travel beside them).
use rkyv::{Archive, Deserialize, Serialize};

/// Every frame's header is one of these.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Message {
    /// Node → router, first frame of the control stream.
    Hello(Hello),
    /// Router → node: the join is accepted.
    Welcome(Welcome),
    /// Node → router: a model version was added, changed readiness, or went away.
    ModelEvent(ModelEvent),
    /// Node → router, periodically: how loaded each model version is.
    LoadReport(LoadReport),
    /// Node → router: the node is stopping; route nothing new to it.
    Drain,
    /// Router → node: nothing of the router's is in flight on a draining node any more; it may leave.
    Released,
    /// Node → router: the node leaves now.
    Goodbye,
    /// Opens a request stream: one inference request (its tensors follow in the payload).
    Request(RequestHead),
    /// One answer on a request stream; a decoupled model sends several, the last one flagged.
    Answer(Answer),
    /// Opens a statistics stream: the statistics extension for a model (empty name: every model).
    StatsQuery(StatsQuery),
    /// Answer to a statistics query: an encoded `inference.ModelStatisticsResponse`, or an error.
    StatsReply(StatsReply),
    /// Router → node, on the control stream: load this model of the cluster repository.
    Place(Place),
    /// Node → router, on the control stream: how a `Place` ended.
    Placed(Placed),
    /// Router → node, on the control stream: unload this model the router placed here.
    Evict(Evict),
    /// Router → node, on the control stream: everything the router placed here has moved away
    /// (`mesh-ops drain`); the node may be stopped.
    MayStop(Fence),
    /// Router → node, on the control stream: this router leads placement from this epoch on; the
    /// node refuses placement commands of any lower epoch from then on (a deposed leader's).
    Fence(Fence),
    /// Node → router, opens a stream: send the files of a placed model (answered by `FileChunk`s
    /// and a `FetchEnd`).
    Fetch(Fetch),
    /// One piece of one file of a model being shipped; the bytes are the payload.
    FileChunk(FileChunk),
    /// The last frame of a shipment: every file was sent, or why not.
    FetchEnd(FetchEnd),
    /// Caller → server, on a streamed request's stream: the server may send this many more answers.
    /// The caller grants them only as its own client makes room, so a client that stops reading
    /// stops the stream at the server (nothing piles up unread in the link).
    Credit(u32),
}

/// A model the router places on a node.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Place {
    pub model: String,
    /// The shipment's key (a hash of the model's name and every file's path and content): the
    /// node's cache holds a complete copy under it, or fetches one.
    pub key: String,
    /// The files, as the router's manifest lists them (paths relative to the model directory).
    pub files: Vec<FileEntry>,
    /// A config override (Triton's JSON `ModelConfig`, as the repository extension's `config`
    /// parameter); empty: the shipped config.pbtxt.
    pub config: String,
    /// The placement leader's fencing token (see `Fence`).
    pub epoch: u64,
}

/// The fencing token of a placement leader: the etcd revision at which it won the election (0 for
/// a router without etcd). Tokens only grow, so a node that saw a higher one refuses the command:
/// a lease lock alone does not stop a paused, deposed leader from acting.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub epoch: u64,
}

/// The outcome of a `Place` on the node.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Placed {
    pub model: String,
    pub key: String,
    /// Empty: the model loaded and is ready; else why it did not.
    pub error: String,
    /// Bytes the model takes on the node as it measured them (its files times its instances).
    pub footprint: u64,
}

/// One file of a shipped model.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FileEntry {
    /// Relative to the model directory, '/'-separated, never absolute nor with `..`.
    pub path: String,
    pub size: u64,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Evict {
    pub model: String,
    pub epoch: u64,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Fetch {
    pub model: String,
    pub key: String,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FileChunk {
    /// Index of the file in the `Place` manifest; chunks come in file order, each file's in order.
    pub file: u32,
    /// Byte offset of this chunk in the file.
    pub offset: u64,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum FetchEnd {
    Done,
    Error(WireError),
}

/// Who a node is and what it serves, sent once per connection.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Hello {
    /// The node's name, unique in the cluster (`--node-name`).
    pub name: String,
    /// Fresh random id per process start: a restarted node at the same name is a new member.
    pub incarnation: u64,
    /// "cpu", "gpu:0", ... what the node can run models on.
    pub devices: Vec<String>,
    /// The node's own HTTP and gRPC endpoints, for operators ("" when disabled).
    pub http: String,
    pub grpc: String,
    /// Every served model version.
    pub models: Vec<ModelStatus>,
    /// Bytes of memory the node offers for models the router places (`--cluster-memory`).
    pub memory: u64,
    /// The node's inbound shared-memory arena, for a router on the same host (`shm`).
    pub arena: Option<ArenaOffer>,
}

/// The router's answer to a hello.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Welcome {
    /// The router's own id (for logs).
    pub router: String,
    /// The id the router gave this link.
    pub link: u64,
    /// The router's inbound shared-memory arena, for a node on the same host (`shm`).
    pub arena: Option<ArenaOffer>,
}

/// A shared-memory arena one end of a link created for the other to write payloads into: its path,
/// and the random id written in it (proof that the file opened is the one offered).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ArenaOffer {
    pub path: String,
    pub id: u128,
}

/// One model version on a node.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ModelStatus {
    pub name: String,
    pub version: i64,
    pub ready: bool,
    /// Why it is not ready (empty when ready).
    pub reason: String,
    /// The served config, protobuf-encoded `inference.ModelConfig`.
    pub config: Vec<u8>,
    /// The router placed it here (from the cluster repository); false: the node's own repository.
    pub placed: bool,
}

/// A change to what a node serves.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum ModelEvent {
    Update(ModelStatus),
    Removed { name: String, version: i64 },
}

/// Load of one model version on a node.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ModelLoad {
    pub name: String,
    pub version: i64,
    /// Requests of this version running or queued on the node.
    pub inflight: u32,
    /// Of those, how many wait in a queue.
    pub queued: u32,
    /// Recent mean execution time, in microseconds (0 when nothing ran yet).
    pub exec_us: u64,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct LoadReport {
    pub models: Vec<ModelLoad>,
}

/// A request or response parameter.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum ParamValue {
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    String(String),
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Param {
    pub key: String,
    pub value: ParamValue,
}

/// Where one tensor's bytes lie in the frame's payload.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TensorHead {
    pub name: String,
    /// `DataType` as numbered by `convert::dtype_code`.
    pub dtype: u8,
    pub shape: Vec<i64>,
    /// Byte offset in the payload, a multiple of `frame::TENSOR_ALIGN`.
    pub offset: u64,
    pub len: u64,
}

/// An inference request; its tensors are in the payload.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RequestHead {
    pub model: String,
    pub version: String,
    pub id: String,
    /// Empty: every output.
    pub outputs: Vec<OutputWanted>,
    pub parameters: Vec<Param>,
    pub inputs: Vec<TensorHead>,
    /// The sender takes several answers (a decoupled model's stream); otherwise exactly one comes.
    pub stream: bool,
    /// The W3C trace context of the sender's span (a router's attempt, a node's calling model), so
    /// the receiver's spans join the client's one trace: `traceparent` (empty: none) and `tracestate`.
    pub traceparent: String,
    pub tracestate: String,
}

/// An output a request asks for.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct OutputWanted {
    pub name: String,
    /// The classification extension's class count; 0: the output itself.
    pub class_count: u32,
}

/// A successful answer; its tensors are in the payload.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ResponseHead {
    pub model: String,
    pub version: String,
    pub id: String,
    pub parameters: Vec<Param>,
    pub outputs: Vec<TensorHead>,
}

/// An error that crossed the link: the mesh error code, and whether the request ever ran, so retry
/// decisions never read the message.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct WireError {
    /// `Code` as numbered by `convert::code_number`.
    pub code: u8,
    /// `ErrorKind` as a number (unknown numbers read as `Answered`, the safe side).
    pub kind: u8,
    pub message: String,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum AnswerBody {
    Response(ResponseHead),
    Error(WireError),
    /// A bare final flag (a decoupled model ended without a last response).
    Empty,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Answer {
    /// Nothing follows for this request.
    pub last: bool,
    pub body: AnswerBody,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StatsQuery {
    pub name: String,
    pub version: String,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum StatsReply {
    /// Protobuf-encoded `inference.ModelStatisticsResponse`.
    Stats(Vec<u8>),
    Error(WireError),
}
