//! Response bodies and the few shapes of response a stand-in sends.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, SizeHint};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde::Serialize;
use tokio::sync::mpsc;

use super::status::{Errors, Status};

pub type Body = BoxBody<Bytes, Infallible>;
pub type Reply = Response<Body>;

pub fn bytes(code: u16, content_type: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut resp = Response::new(Full::new(body.into()).boxed());
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

pub fn json(code: u16, value: &impl Serialize) -> Reply {
    match serde_json::to_vec(value) {
        Ok(body) => bytes(code, "application/json", body),
        Err(e) => error(&Status::internal(format!("encoding the response: {e}"))),
    }
}

pub fn text(code: u16, body: &'static str) -> Reply {
    bytes(code, "text/plain; charset=utf-8", body)
}

pub fn error(status: &Status) -> Reply {
    bytes(status.code, "application/json", status.to_json())
}

pub fn empty(code: u16) -> Reply {
    let mut resp = Response::new(Full::new(Bytes::new()).boxed());
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp
}

/// A streamed body: each message becomes one DATA frame / chunk as soon as it is sent, and the
/// stream ends when the sender is dropped.
pub fn stream(content_type: &'static str, rx: mpsc::Receiver<Bytes>) -> Reply {
    let mut resp = Response::new(ChannelBody { rx }.boxed());
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
