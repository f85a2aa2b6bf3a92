//! The SageMaker frontend's decisions: routes, restricted groups, Content-Type framing, status
//! codes, the port checks, and which model directories a load may read.
use std::sync::Mutex;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::*;
use crate::request::{InferRequest, InferResponse};
use crate::{IndexEntry, LoadOptions, ModelView};

#[test]
fn routes_are_read_as_tritonservers_expressions_read_them() {
    let (get, post, delete, put) = (Method::GET, Method::POST, Method::DELETE, Method::PUT);
    let name = |n: &str| n.to_string();
    let cases = [
        (&get, "/ping", Route::Ping),
        (&post, "/ping", Route::Ping),
        (&post, "/invocations", Route::Invocations),
        (&get, "/models", Route::List),
        (&get, "/models/", Route::List),
        (&get, "/models/m", Route::Get(name("m"))),
        (&get, "/models/m/invoke", Route::Get(name("m"))),
        (&post, "/models", Route::Load),
        (&post, "/models/m", Route::Load),
        (&post, "/models/m/invoke", Route::Invoke(name("m"))),
        (&post, "/models/invoke", Route::Load),
        (&post, "/models//invoke", Route::Invoke(name(""))),
        (&delete, "/models/m", Route::Unload(name("m"))),
        (&delete, "/models", Route::Unload(name(""))),
        (&put, "/models/m", Route::Unknown),
        (&get, "/models/m/x", Route::Unknown),
        (&get, "/models/m/invoke/", Route::Unknown),
        (&get, "/ping/", Route::Unknown),
        (&get, "/v2/health/ready", Route::Unknown),
        (&get, "/modelsx", Route::Get(name("x"))),
    ];
    for (method, path, want) in cases {
        assert_eq!(route(method, path), want, "{method} {path}");
    }
}

#[test]
fn every_route_but_the_unknown_has_its_restricted_group() {
    assert_eq!(group(&Route::Ping), Some("health"));
    assert_eq!(group(&Route::Invocations), Some("inference"));
    assert_eq!(group(&Route::Invoke("m".into())), Some("inference"));
    for r in [
        Route::List,
        Route::Get("m".into()),
        Route::Load,
        Route::Unload("m".into()),
    ] {
        assert_eq!(group(&r), Some("model-repository"), "{r:?}");
    }
    assert_eq!(group(&Route::Unknown), None);
}

#[test]
fn the_content_type_gives_the_json_size_as_tritonserver_reads_it() {
    let v = |s: &str| HeaderValue::from_str(s).unwrap();
    assert_eq!(header_length(None, 10).unwrap(), None);
    assert_eq!(header_length(Some(&v("application/json")), 10).unwrap(), None);
    assert_eq!(header_length(Some(&v(&binary_content_type(4))), 10).unwrap(), Some(4));
    assert_eq!(header_length(Some(&v(&binary_content_type(10))), 10).unwrap(), Some(10));
    // atoi: what is not a number reads as 0 (a raw body), trailing text is ignored.
    assert_eq!(
        header_length(Some(&v(&format!("{BINARY_MIME}x"))), 10).unwrap(),
        Some(0)
    );
    assert_eq!(
        header_length(Some(&v(&format!("{BINARY_MIME} 7;q"))), 10).unwrap(),
        Some(7)
    );
    let e = header_length(Some(&v(&binary_content_type(11))), 10).unwrap_err();
    assert_eq!(e.message, "inference header size should be in range (0, 10), got: 11");
    let e = header_length(Some(&v(&format!("{BINARY_MIME}-1"))), 10).unwrap_err();
    assert_eq!(e.message, "inference header size should be in range (0, 10), got: -1");
    let e = header_length(Some(&v(&format!("x;{BINARY_MIME}1"))), 10).unwrap_err();
    assert!(
        e.message.starts_with("expect MIME type for binary data starts with '"),
        "{}",
        e.message
    );
}

#[test]
fn out_of_memory_errors_are_507_and_others_400() {
    let status = |m: &str| mme_error(&Error::internal(m)).status();
    assert_eq!(
        status("CUDA out of memory. Tried to allocate"),
        StatusCode::INSUFFICIENT_STORAGE
    );
    assert_eq!(status("No space left on device"), StatusCode::INSUFFICIENT_STORAGE);
    assert_eq!(status("unknown model"), StatusCode::BAD_REQUEST);
}

#[test]
fn ports_are_checked_as_tritonserver_checks_them() {
    let any: IpAddr = "0.0.0.0".parse().unwrap();
    let local: IpAddr = "127.0.0.1".parse().unwrap();
    let ok = [("HTTP", any, 8000, None), ("SageMaker", any, 8080, None)];
    assert_eq!(check_ports(&ok), Ok(()));
    let same = [("HTTP", any, 8080, None), ("SageMaker", any, 8080, None)];
    assert_eq!(
        check_ports(&same).unwrap_err(),
        "The server cannot listen to HTTP requests and SageMaker requests at the same address and port 0.0.0.0:8080"
    );
    let ranged = [("HTTP", any, 8000, None), ("SageMaker", any, 8080, Some((8081, 9000)))];
    assert_eq!(
        check_ports(&ranged).unwrap_err(),
        "The server cannot listen to HTTP requests at port 8000, allowed port range is [8081, 9000]"
    );
    let elsewhere = [
        ("HTTP", local, 8000, None),
        ("SageMaker", any, 8080, Some((8081, 9000))),
    ];
    assert_eq!(check_ports(&elsewhere), Ok(()));
    assert_eq!(parse_port_range("8081-9000"), Ok((8081, 9000)));
    assert!(parse_port_range("8081").is_err() && parse_port_range("a-b").is_err());
}

#[test]
fn a_load_body_names_the_model_and_its_url() {
    assert_eq!(load_request(b"").unwrap(), (String::new(), String::new()));
    let body = br#"{"model_name": "m", "url": "/x"}"#;
    assert_eq!(load_request(body).unwrap(), ("m".into(), "/x".into()));
    assert!(load_request(br#"{"model_name": 1}"#).is_err());
    assert!(load_request(b"{").is_err());
}

fn write(path: &FsPath, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_model_directory_is_read_whole_and_served_under_the_target_name() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("model");
    write(&m.join("config.pbtxt"), "name: \"other\"\nbackend: \"python\"\n");
    write(&m.join("1/model.py"), "pass");
    let (options, url) = model_at(m.to_str().unwrap(), "simple", 1024).unwrap();
    assert_eq!(url, m.to_str().unwrap());
    let config: serde_json::Value = serde_json::from_str(options.config.as_deref().unwrap()).unwrap();
    assert_eq!(config["name"], "simple");
    assert_eq!(config["backend"], "python");
    let names: Vec<&str> = options.files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["1/model.py"]);
    assert_eq!(
        sagemaker_parent("/opt/ml/models/abc123/model").as_deref(),
        Some("/opt/ml/models/abc123")
    );
    assert_eq!(
        sagemaker_parent("/opt/ml/models/abc123/model/sub").as_deref(),
        Some("/opt/ml/models/abc123")
    );
    assert_eq!(sagemaker_parent("/tmp/abc/model"), None);
}

#[test]
fn a_repository_gives_the_model_named_by_the_target_or_its_only_one() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path();
    write(&repo.join("a/1/model.py"), "a");
    let (options, url) = model_at(repo.to_str().unwrap(), "t", 1024).unwrap();
    assert_eq!(url, repo.to_str().unwrap());
    assert_eq!(options.files[0].0, "1/model.py");
    write(&repo.join("b/1/model.py"), "b");
    let e = model_at(repo.to_str().unwrap(), "t", 1024).unwrap_err();
    assert!(
        e.message.contains("holds 2 model directories and none is named 't'"),
        "{}",
        e.message
    );
    let (options, _) = model_at(repo.to_str().unwrap(), "b", 1024).unwrap();
    assert_eq!(&options.files[0].1[..], b"b");
}

#[test]
fn nothing_outside_the_model_directory_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let secret = tmp.path().join("secret.txt");
    write(&secret, "secret");
    let m = tmp.path().join("m");
    write(&m.join("config.pbtxt"), "backend: \"python\"\n");
    std::os::unix::fs::symlink(&secret, m.join("leak")).unwrap();
    let e = model_at(m.to_str().unwrap(), "m", 1024).unwrap_err();
    assert!(
        e.message.contains("'leak' links outside the model directory"),
        "{}",
        e.message
    );
    // A link that stays inside is read as its target.
    std::fs::remove_file(m.join("leak")).unwrap();
    write(&m.join("1/model.py"), "x");
    std::os::unix::fs::symlink(m.join("1/model.py"), m.join("1/alias.py")).unwrap();
    let (options, _) = model_at(m.to_str().unwrap(), "m", 1024).unwrap();
    assert_eq!(options.files.len(), 2);
    for bad in ["", "/no/such/dir", secret.to_str().unwrap()] {
        assert!(model_at(bad, "m", 1024).is_err(), "{bad}");
    }
    // The byte limit holds however the files add up.
    let e = model_at(m.to_str().unwrap(), "m", 1).unwrap_err();
    assert!(e.message.contains("larger than the limit of 1 bytes"), "{}", e.message);
}

/// A dispatcher that records loads and unloads; `explicit` says whether it loads on request.
#[derive(Default)]
struct Fake {
    explicit: bool,
    loads: Mutex<Vec<(String, LoadOptions)>>,
    unloads: Mutex<Vec<(String, bool)>>,
    infers: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl Dispatch for Fake {
    async fn infer(&self, request: InferRequest) -> crate::Result<InferResponse> {
        self.infers.lock().unwrap().push(request.model_name.clone());
        Err(Error::invalid("model ran out of memory"))
    }
    fn ready(&self) -> bool {
        false
    }
    fn model(&self, _: &str, _: &str) -> crate::Result<ModelView> {
        Err(Error::not_found("no views here"))
    }
    fn repository_index(&self) -> Vec<IndexEntry> {
        Vec::new()
    }
    async fn load_model(&self, name: &str, options: LoadOptions) -> crate::Result<()> {
        self.loads.lock().unwrap().push((name.to_string(), options));
        Ok(())
    }
    async fn unload_model(&self, name: &str, dependents: bool) -> crate::Result<()> {
        self.unloads.lock().unwrap().push((name.to_string(), dependents));
        Ok(())
    }
    fn extensions(&self) -> Vec<&'static str> {
        if self.explicit {
            vec!["model_repository"]
        } else {
            Vec::new()
        }
    }
}

fn sm_app(fake: Arc<Fake>, rules: &[&str]) -> Router {
    let rules: Vec<String> = rules.iter().map(|r| r.to_string()).collect();
    let options = SageMakerOptions {
        max_input_size: 1 << 20,
        default_model: "dflt".into(),
        ping_live: false,
    };
    let rules = Arc::new(Restrictions::parse(&rules, "api").unwrap());
    router(fake, options, rules, Arc::new(SharedMemory::default()))
}

async fn call(app: &Router, method: Method, path: &str, headers: &[(&str, &str)], body: &str) -> (StatusCode, String) {
    let mut request = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

const INFER: &str = r#"{"inputs":[{"name":"I","datatype":"INT32","shape":[1],"data":[1]}]}"#;

#[tokio::test]
async fn the_multi_model_routes_load_invoke_and_unload() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("model");
    write(&m.join("config.pbtxt"), "backend: \"python\"\n");
    write(&m.join("1/model.py"), "pass");
    let fake = Arc::new(Fake {
        explicit: true,
        ..Default::default()
    });
    let app = sm_app(fake.clone(), &[]);
    let load = format!(r#"{{"model_name": "h1", "url": "{}"}}"#, m.display());
    assert_eq!(
        call(&app, Method::POST, "/models/h1/invoke", &[], INFER).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&app, Method::POST, "/models", &[], &load).await,
        (StatusCode::OK, String::new())
    );
    assert_eq!(fake.loads.lock().unwrap()[0].0, "h1");
    let (status, body) = call(&app, Method::POST, "/models", &[], &load).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = call(&app, Method::GET, "/models/h1", &[], "").await;
    assert_eq!(status, StatusCode::OK);
    let got: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        got,
        serde_json::json!({"modelName": "h1", "modelUrl": m.to_str().unwrap()})
    );
    // Not ready (the fake has no views): an empty row, as tritonserver lists it.
    assert_eq!(
        call(&app, Method::GET, "/models", &[], "").await.1,
        r#"{"models":[{}]}"#
    );
    // The target-model header names the model run; its out-of-memory error is a 507.
    let target = [("x-amzn-sagemaker-target-model", "other")];
    let (status, body) = call(&app, Method::POST, "/models/h1/invoke", &target, INFER).await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{body}");
    assert_eq!(fake.infers.lock().unwrap().as_slice(), ["other"]);
    assert_eq!(
        call(&app, Method::DELETE, "/models/nope", &[], "").await.0,
        StatusCode::NOT_FOUND
    );
    // A DELETE unloads the model its name loaded, whatever the target-model header says.
    assert_eq!(
        call(&app, Method::DELETE, "/models/h1", &target, "").await.0,
        StatusCode::OK
    );
    assert_eq!(fake.unloads.lock().unwrap().as_slice(), [("h1".to_string(), true)]);
    assert_eq!(
        call(&app, Method::GET, "/models/h1", &[], "").await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn loads_need_explicit_model_control_and_a_safe_name() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake::default());
    let app = sm_app(fake.clone(), &[]);
    let load = format!(r#"{{"model_name": "m", "url": "{}"}}"#, tmp.path().display());
    let (status, body) = call(&app, Method::POST, "/models", &[], &load).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("explicit model load / unload is not allowed"), "{body}");
    let explicit = Arc::new(Fake {
        explicit: true,
        ..Default::default()
    });
    let app = sm_app(explicit.clone(), &[]);
    let traversal = [("x-amzn-sagemaker-target-model", "..")];
    let (status, body) = call(&app, Method::POST, "/models", &traversal, &load).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("invalid model name"), "{body}");
    assert!(fake.loads.lock().unwrap().is_empty() && explicit.loads.lock().unwrap().is_empty());
}

#[tokio::test]
async fn restricted_groups_ping_and_invocations_answer_as_on_the_http_port() {
    let fake = Arc::new(Fake {
        explicit: true,
        ..Default::default()
    });
    let app = sm_app(fake.clone(), &["model-repository:admin=s3cret"]);
    let (status, body) = call(&app, Method::GET, "/models", &[], "").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body, r#"{"error":"This API is restricted, expecting header 'admin'"}"#);
    assert_eq!(
        call(&app, Method::POST, "/models", &[], "{}").await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&app, Method::DELETE, "/models/x", &[], "").await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&app, Method::GET, "/models", &[("admin", "s3cret")], "").await.0,
        StatusCode::OK
    );
    // Readiness is what /ping answers by default; only GET.
    assert_eq!(
        call(&app, Method::GET, "/ping", &[], "").await,
        (StatusCode::BAD_REQUEST, String::new())
    );
    let (status, body) = call(&app, Method::POST, "/ping", &[], "").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::METHOD_NOT_ALLOWED, r#"{"error":"Method Not Allowed"}"#)
    );
    assert_eq!(
        call(&app, Method::GET, "/invocations", &[], "").await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        call(&app, Method::GET, "/elsewhere", &[], "").await,
        (StatusCode::BAD_REQUEST, String::new())
    );
    // /invocations runs the default model; its errors keep the HTTP port's codes.
    let (status, _) = call(&app, Method::POST, "/invocations", &[], INFER).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(fake.infers.lock().unwrap().as_slice(), ["dflt"]);
}
