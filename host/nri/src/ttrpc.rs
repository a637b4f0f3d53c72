//! ttrpc, the RPC of containerd's local sockets, as far as unary calls need it: a message is a 10-byte header
//! (data length and stream id, big-endian `u32`; type; flags) and its data, a protobuf `Request` or `Response`.
//! Clients use odd stream ids; the data of one message is at most [`MAX_DATA`] bytes.
//!
//! Streaming calls (the `Data` type) are not used by NRI and are refused.

use prost::Message as _;

pub const HEADER: usize = 10;
/// The largest message data ttrpc allows.
pub const MAX_DATA: usize = 4 << 20;

pub const REQUEST: u8 = 1;
pub const RESPONSE: u8 = 2;

/// gRPC status codes ttrpc reuses, those this crate answers with.
pub mod code {
    pub const OK: i32 = 0;
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const UNIMPLEMENTED: i32 = 12;
}

/// One ttrpc message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub stream: u32,
    pub kind: u8,
    pub flags: u8,
    pub data: Vec<u8>,
}

impl Message {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.data.len());
        out.extend_from_slice(&(self.data.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.stream.to_be_bytes());
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&self.data);
        out
    }

    /// A request message for `stream`.
    pub fn request(stream: u32, request: &Request) -> Message {
        Message {
            stream,
            kind: REQUEST,
            flags: 0,
            data: request.encode_to_vec(),
        }
    }

    /// A response message for `stream`.
    pub fn response(stream: u32, response: &Response) -> Message {
        Message {
            stream,
            kind: RESPONSE,
            flags: 0,
            data: response.encode_to_vec(),
        }
    }
}

/// Reassembles the messages of one connection from its frames' payloads, which may split a message anywhere.
/// Holds at most one message's worth of bytes beyond what it has returned.
#[derive(Default)]
pub struct Assembler {
    buf: Vec<u8>,
}

impl Assembler {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole message, if the bytes pushed hold one. A declared length over [`MAX_DATA`] is an error: the
    /// connection cannot be read further.
    pub fn next_message(&mut self) -> Result<Option<Message>, String> {
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > MAX_DATA {
            return Err(format!(
                "a ttrpc message of {len} bytes, over ttrpc's {MAX_DATA}"
            ));
        }
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        let stream = u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]);
        let (kind, flags) = (self.buf[8], self.buf[9]);
        let data = self.buf[HEADER..HEADER + len].to_vec();
        self.buf.drain(..HEADER + len);
        Ok(Some(Message {
            stream,
            kind,
            flags,
            data,
        }))
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Request {
    #[prost(string, tag = "1")]
    pub service: String,
    #[prost(string, tag = "2")]
    pub method: String,
    #[prost(bytes = "vec", tag = "3")]
    pub payload: Vec<u8>,
    /// What is left of the caller's deadline, in nanoseconds; 0 when it has none.
    #[prost(int64, tag = "4")]
    pub timeout_nano: i64,
    #[prost(message, repeated, tag = "5")]
    pub metadata: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Response {
    #[prost(message, optional, tag = "1")]
    pub status: Option<Status>,
    #[prost(bytes = "vec", tag = "2")]
    pub payload: Vec<u8>,
}

/// google.rpc.Status without its details.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

impl Response {
    pub fn ok(payload: Vec<u8>) -> Response {
        Response {
            status: Some(Status {
                code: code::OK,
                message: String::new(),
            }),
            payload,
        }
    }

    pub fn error(code: i32, message: impl Into<String>) -> Response {
        Response {
            status: Some(Status {
                code,
                message: message.into(),
            }),
            payload: Vec::new(),
        }
    }

    /// The payload of a successful response; the status's code and message otherwise.
    pub fn into_result(self) -> Result<Vec<u8>, (i32, String)> {
        match self.status {
            Some(s) if s.code != code::OK => Err((s.code, s.message)),
            _ => Ok(self.payload),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_split_anywhere_come_out_whole_and_in_order() {
        let a = Message::request(
            1,
            &Request {
                service: "s".into(),
                method: "m".into(),
                ..Default::default()
            },
        );
        let b = Message::response(3, &Response::error(code::UNKNOWN, "no"));
        let wire = [a.encode(), b.encode()].concat();
        for cut in 0..wire.len() {
            let mut asm = Assembler::default();
            let mut got = Vec::new();
            for part in [&wire[..cut], &wire[cut..]] {
                asm.push(part);
                while let Some(m) = asm.next_message().unwrap() {
                    got.push(m);
                }
            }
            assert_eq!(got, vec![a.clone(), b.clone()], "cut at {cut}");
        }
    }

    #[test]
    fn a_declared_length_over_the_limit_is_refused_before_it_is_buffered() {
        let mut asm = Assembler::default();
        asm.push(
            &[
                &((MAX_DATA + 1) as u32).to_be_bytes()[..],
                &[0, 0, 0, 1, REQUEST, 0],
            ]
            .concat(),
        );
        assert!(asm.next_message().unwrap_err().contains("over ttrpc's"));
    }

    #[test]
    fn a_response_without_status_or_with_ok_is_its_payload() {
        let r = Response {
            status: None,
            payload: vec![1],
        };
        assert_eq!(r.into_result(), Ok(vec![1]));
        assert_eq!(Response::ok(vec![2]).into_result(), Ok(vec![2]));
        assert_eq!(
            Response::error(code::UNIMPLEMENTED, "x").into_result(),
            Err((12, "x".into()))
        );
    }
}
