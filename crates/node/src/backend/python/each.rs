//! Requests of a model without dynamic batching that queued while its stub was busy: they travel to
//! the stub in one frame, it runs one `execute([request])` per request and sends each answer as soon
//! as it has it (`answer` frames), then ends with the last one and the requests it rescheduled.
use std::time::Instant;

use mesh::{Error, Result};
use serde_json::json;

use super::{rescheduled, stub_error, PythonBackend};
use crate::backend::{Deliver, RequestView};

impl PythonBackend {
    /// One frame of requests, each run in an `execute` of its own; every answer goes to `deliver`
    /// by its place as it arrives. Returns the places of the requests the model rescheduled.
    pub(super) fn execute_streamed(
        &mut self,
        requests: &[RequestView<'_>],
        deliver: Deliver<'_>,
    ) -> Result<Vec<usize>> {
        if let Some(why) = &self.dead {
            return Err(Error::unavailable(why.clone()));
        }
        self.stub.shm.reset();
        let (encoded, blob) = self.encode_requests(requests);
        self.seq += 1;
        let header = json!({"op": "execute", "seq": self.seq, "requests": encoded, "each": true});
        self.send(&header, &blob)?;
        let count = requests.len();
        let mut answered = vec![false; count];
        loop {
            // Each request's execute has the whole timeout of its own.
            let deadline = Instant::now() + self.ctx.settings.execute_timeout;
            let (frame, blob) = self.next_reply_watching(deadline, requests)?;
            match frame["op"].as_str() {
                Some("answer") => {
                    let place = frame["index"].as_u64().map(|i| i as usize).filter(|&i| i < count);
                    let Some(i) = place.filter(|&i| !answered[i]) else {
                        return Err(Error::internal(format!(
                            "python stub answered request {} of {count}, or twice",
                            frame["index"]
                        )));
                    };
                    answered[i] = true;
                    deliver(i, self.response_from(&frame["response"], &blob));
                }
                Some("error") => return Err(stub_error(&frame)),
                _ => {
                    let responses = frame["responses"]
                        .as_array()
                        .filter(|r| r.len() == count)
                        .ok_or_else(|| Error::internal(format!("python stub answered no list of {count} responses")))?;
                    let again = rescheduled(&frame, count);
                    for (i, response) in responses.iter().enumerate() {
                        if !answered[i] && !again.contains(&i) {
                            deliver(i, self.response_from(response, &blob));
                        }
                    }
                    return Ok(again);
                }
            }
        }
    }
}
