//! Round trips and hostile input for the link's frames, without sockets.
use bytes::Bytes;

use super::*;
use crate::cluster::frame::{decode_all, Frame, Prelude, PRELUDE_LEN, PROTOCOL_VERSION, TENSOR_ALIGN};

fn join(chunks: Vec<Bytes>) -> Vec<u8> {
    chunks.iter().flat_map(|c| c.iter().copied()).collect()
}

fn request_head(frame: Frame) -> (RequestHead, Bytes) {
    match frame.message {
        Message::Request(h) => (h, frame.payload),
        other => panic!("expected a request, got {other:?}"),
    }
}

fn sample_request() -> InferRequest {
    let mut inputs = Vec::new();
    for (i, d) in DataType::ALL.iter().enumerate() {
        let tensor = match d {
            DataType::Bytes => Tensor::from_bytes_elements(vec![3], [&b"a\0b"[..], b"", &[0xff, 0xfe]]),
            _ => {
                let size = d.element_size().unwrap();
                let n = 1 + i; // odd sizes, so padding is exercised
                let data: Vec<u8> = (0..size * n).map(|b| (b * 7 + i) as u8).collect();
                Tensor::new(*d, vec![n as i64], Bytes::from(data)).unwrap()
            }
        };
        inputs.push(NamedTensor {
            name: format!("in_{}", d.wire_name()),
            tensor,
        });
    }
    InferRequest {
        model_name: "m".into(),
        model_version: "3".into(),
        id: "req-1".into(),
        inputs,
        outputs: vec![RequestedOutput {
            name: "y".into(),
            class_count: Some(5),
        }],
        parameters: vec![
            ("priority".into(), Param::Uint(2)),
            ("timeout".into(), Param::Int(-1)),
            ("flag".into(), Param::Bool(true)),
            ("ratio".into(), Param::Double(0.5)),
            ("s".into(), Param::String("é".into())),
        ],
        ..Default::default()
    }
}

#[test]
fn request_round_trip_keeps_every_type_and_slices_the_payload_without_copies() {
    let limits = Limits::default();
    let request = sample_request();
    let bytes = join(request_frame(&request, true, None, &limits).unwrap());
    let (head, payload) = request_head(decode_all(&bytes, &limits).unwrap());
    let (back, stream) = request_from(head, &payload).unwrap();
    assert!(stream);
    assert_eq!(back, request);
    let base = payload.as_ptr() as usize;
    assert_eq!(base % TENSOR_ALIGN, 0, "the receive buffer is aligned");
    for t in &back.inputs {
        let at = t.tensor.data.as_ptr() as usize;
        if !t.tensor.data.is_empty() {
            assert!(
                at >= base && at + t.tensor.data.len() <= base + payload.len(),
                "{} is a slice",
                t.name
            );
            assert_eq!((at - base) % TENSOR_ALIGN, 0, "{} starts aligned", t.name);
        }
    }
}

#[test]
fn answers_round_trip_responses_errors_and_bare_finals() {
    let limits = Limits::default();
    let response = InferResponse {
        model_name: "m".into(),
        model_version: "1".into(),
        id: "x".into(),
        outputs: vec![NamedTensor {
            name: "y".into(),
            tensor: Tensor::from_values(vec![2], &[1.5f32, -2.0]),
        }],
        parameters: vec![("triton_final_response".into(), Param::Bool(true))],
    };
    let cases: Vec<Option<std::result::Result<InferResponse, (Error, ErrorKind)>>> = vec![
        Some(Ok(response.clone())),
        Some(Err((Error::invalid("bad input 'x'"), ErrorKind::Answered))),
        Some(Err((Error::unavailable("draining"), ErrorKind::NotStarted))),
        Some(Err((Error::unavailable("busy"), ErrorKind::Overloaded))),
        None,
    ];
    for (i, case) in cases.iter().enumerate() {
        let last = i % 2 == 0;
        let frame = decode_all(&join(answer_frame(case.as_ref(), last, &limits).unwrap()), &limits).unwrap();
        let Message::Answer(a) = frame.message else {
            panic!("not an answer")
        };
        assert_eq!(a.last, last);
        match (answer_from(a.body, &frame.payload).unwrap(), case) {
            (Answered::Response(r), Some(Ok(want))) => assert_eq!(&r, want),
            (Answered::Error(e, k), Some(Err((we, wk)))) => assert_eq!((&e, &k), (we, wk)),
            (Answered::Empty, None) => {}
            (got, want) => panic!("case {i}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn every_code_and_kind_survives_the_link_and_unknown_numbers_are_safe() {
    use Code::*;
    for c in [
        InvalidArgument,
        NotFound,
        Unavailable,
        Unsupported,
        Internal,
        AlreadyExists,
        Cancelled,
        PayloadTooLarge,
        Overloaded,
        Unknown,
    ] {
        assert_eq!(code_from(code_number(c)), c);
    }
    assert_eq!(code_from(200), Internal);
    for k in [ErrorKind::Answered, ErrorKind::NotStarted, ErrorKind::Overloaded] {
        assert_eq!(ErrorKind::from_number(k.number()), k);
    }
    // A kind from a newer peer is treated as "it ran": never retried.
    assert_eq!(ErrorKind::from_number(99), ErrorKind::Answered);
    for d in DataType::ALL {
        assert_eq!(dtype_from(dtype_code(d)), Some(d));
    }
    assert_eq!(dtype_from(14), None);
}

fn prelude(version: u8, header_len: u32, payload_len: u64) -> [u8; PRELUDE_LEN] {
    Prelude {
        version,
        header_len,
        payload_len,
    }
    .encode()
}

#[test]
fn preludes_are_checked_before_anything_is_allocated() {
    let limits = Limits {
        max_header: 1024,
        max_payload: 4096,
        ..Limits::default()
    };
    let ok = prelude(PROTOCOL_VERSION, 100, 4096);
    assert!(Prelude::decode(&ok, &limits).is_ok());
    let mut garbage = ok;
    garbage[0] = b'G';
    assert!(matches!(
        Prelude::decode(&garbage, &limits),
        Err(FrameError::NotMesh(_))
    ));
    let e = Prelude::decode(&prelude(99, 100, 0), &limits).unwrap_err();
    assert_eq!(e, FrameError::Version { got: 99 });
    assert!(e.to_string().contains("version 99 is not supported"), "{e}");
    let e = Prelude::decode(&prelude(PROTOCOL_VERSION, 1025, 0), &limits).unwrap_err();
    assert!(
        matches!(
            e,
            FrameError::TooLarge {
                what: "frame header",
                ..
            }
        ),
        "{e}"
    );
    let e = Prelude::decode(&prelude(PROTOCOL_VERSION, 0, 0), &limits).unwrap_err();
    assert!(
        matches!(e, FrameError::TooLarge { .. }),
        "an empty header is refused: {e}"
    );
    let e = Prelude::decode(&prelude(PROTOCOL_VERSION, 10, u64::MAX), &limits).unwrap_err();
    assert!(
        matches!(
            e,
            FrameError::TooLarge {
                what: "frame payload",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn the_sender_refuses_a_frame_over_the_limits() {
    let limits = Limits {
        max_header: 1 << 20,
        max_payload: 16,
        ..Limits::default()
    };
    let mut request = sample_request();
    request.inputs.truncate(1);
    request.inputs[0].tensor = Tensor::from_values(vec![8], &[0f32; 8]);
    let e = request_frame(&request, false, None, &limits).unwrap_err();
    assert!(matches!(e, FrameError::TooLarge { len: 32, limit: 16, .. }), "{e}");
}

#[test]
fn truncated_and_corrupt_frames_are_errors_not_panics() {
    let limits = Limits::default();
    let bytes = join(request_frame(&sample_request(), false, None, &limits).unwrap());
    for cut in [0, 5, PRELUDE_LEN, PRELUDE_LEN + 3, bytes.len() - 1] {
        assert!(
            matches!(decode_all(&bytes[..cut], &limits), Err(FrameError::Truncated { .. })),
            "cut at {cut}"
        );
    }
    // Flip bytes across the header: validation rejects or the values still decode; never a panic.
    let header_end = PRELUDE_LEN + u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
    let mut rejected = 0;
    for at in PRELUDE_LEN..header_end {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bad = bytes.clone();
            bad[at] ^= flip;
            match decode_all(&bad, &limits) {
                Err(_) => rejected += 1,
                Ok(frame) => {
                    if let Message::Request(h) = frame.message {
                        let _ = request_from(h, &frame.payload);
                    }
                }
            }
        }
    }
    assert!(rejected > 0, "some corruptions must be caught by validation");
    // Pure noise after a valid prelude.
    let mut noise = prelude(PROTOCOL_VERSION, 64, 0).to_vec();
    noise.extend((0..64u32).map(|i| (i * 37 + 11) as u8));
    assert!(matches!(decode_all(&noise, &limits), Err(FrameError::Corrupt(_))));
}

fn with_input(head: TensorHead, payload: Bytes) -> std::result::Result<(InferRequest, bool), FrameError> {
    let h = RequestHead {
        model: "m".into(),
        version: String::new(),
        id: String::new(),
        outputs: vec![],
        parameters: vec![],
        inputs: vec![head],
        stream: false,
        traceparent: String::new(),
        tracestate: String::new(),
    };
    request_from(h, &payload)
}

#[test]
fn tensor_heads_are_checked_against_the_payload() {
    let payload = Bytes::from(vec![0u8; 64]);
    let head = |dtype: u8, shape: Vec<i64>, offset: u64, len: u64| TensorHead {
        name: "x".into(),
        dtype,
        shape,
        offset,
        len,
    };
    let fp32 = dtype_code(DataType::Fp32);
    assert!(with_input(head(fp32, vec![4], 0, 16), payload.clone()).is_ok());
    let cases = [
        (head(fp32, vec![4], 56, 16), "outside"),
        (head(fp32, vec![4], u64::MAX, 2), "outside"),
        (head(fp32, vec![5], 0, 16), "needs 20 bytes"),
        (head(fp32, vec![-1], 0, 16), "negative"),
        (head(fp32, vec![1 << 40, 1 << 40], 0, 16), "too large"),
        (head(200, vec![4], 0, 16), "unknown data type"),
        (head(fp32, vec![1; 65], 0, 4), "dimensions"),
        (head(dtype_code(DataType::Bytes), vec![1], 0, 3), "length prefix"),
    ];
    for (h, want) in cases {
        let e = with_input(h.clone(), payload.clone()).unwrap_err();
        assert!(e.to_string().contains(want), "{h:?}: {e}");
    }
}

#[test]
fn the_receive_budget_bounds_what_peers_make_us_reserve() {
    let budget = std::sync::Arc::new(crate::cluster::frame::Budget::new(100));
    let a = budget.reserve(60).unwrap();
    let b = budget.reserve(40).unwrap();
    let e = budget.reserve(1).unwrap_err();
    assert!(
        matches!(
            e,
            FrameError::Busy {
                bytes: 1,
                held: 100,
                limit: 100
            }
        ),
        "{e}"
    );
    assert_eq!(
        Error::from(e).code,
        Code::Overloaded,
        "busy is retried elsewhere, not a client error"
    );
    assert_eq!(budget.used(), 100, "a refused frame holds nothing");
    drop(a);
    assert_eq!(budget.used(), 40);
    assert!(
        budget.reserve(u64::MAX).is_err(),
        "an absurd declaration is refused without overflow"
    );
    drop(b);
    assert_eq!(budget.used(), 0);
}

#[test]
fn a_request_carries_its_senders_trace_context_and_a_peers_oversized_one_is_dropped() {
    let limits = Limits::default();
    let carrier = crate::trace::otel::context::Carrier {
        traceparent: Some("00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01".into()),
        tracestate: Some("vendor=1".into()),
    };
    let bytes = join(request_frame(&sample_request(), false, Some(&carrier), &limits).unwrap());
    let (head, _) = request_head(decode_all(&bytes, &limits).unwrap());
    assert_eq!(trace_of(&head), Some(carrier.clone()));
    let bytes = join(request_frame(&sample_request(), false, None, &limits).unwrap());
    let (head, _) = request_head(decode_all(&bytes, &limits).unwrap());
    assert_eq!(trace_of(&head), None);

    let mut hostile = head.clone();
    hostile.traceparent = format!("{}-{}", carrier.traceparent.clone().unwrap(), "x".repeat(4096));
    assert_eq!(trace_of(&hostile), None, "longer than any W3C traceparent");
    hostile.traceparent = carrier.traceparent.clone().unwrap();
    hostile.tracestate = "k=v,".repeat(1000);
    let kept = trace_of(&hostile).expect("the parent is kept");
    assert_eq!(
        kept.tracestate, None,
        "a tracestate over {MAX_TRACESTATE} bytes is dropped"
    );
}
