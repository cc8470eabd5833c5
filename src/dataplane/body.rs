//! The body of a raw configuration push: the rendered text, shared with the render rather
//! than copied, and a last line after it, sent as two chunks of a known length.
//!
//! Why not a `String`: the configuration is 1.5 MB at 10,000 Ingresses, and each pod being
//! pushed to had its own copy of it with the marker line appended. Worse, reqwest keeps a
//! one-buffer body for a resend (redirects, retries) until the answer comes, and a push is
//! answered after the pod's reload, ten seconds under churn on a small machine: three pods
//! kept three copies alive that long. A body of chunks is neither copied nor kept: each chunk
//! is let go once written.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

/// A configuration as pushed: `text`, then `last_line`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigBody {
    text: Arc<str>,
    last_line: String,
}

impl ConfigBody {
    /// `text` followed by `last_line` (a newline is put between them when `text` does not end
    /// with one).
    pub fn with_last_line(text: Arc<str>, last_line: &str) -> Self {
        let separator = if text.is_empty() || text.ends_with('\n') { "" } else { "\n" };
        Self { text, last_line: format!("{separator}{last_line}") }
    }

    /// The whole body as one text.
    pub fn to_text(&self) -> String {
        let mut whole = String::with_capacity(self.text.len() + self.last_line.len());
        whole.push_str(&self.text);
        whole.push_str(&self.last_line);
        whole
    }

    /// The body with a newline at its end when it has none anywhere: the Dataplane API refuses
    /// a body without any newline (its guard against a flattened file).
    pub(crate) fn with_a_newline(mut self) -> Self {
        if !self.text.contains('\n') && !self.last_line.contains('\n') {
            self.last_line.push('\n');
        }
        self
    }

    /// The request body: the shared text, then the last line, with their length known (so it
    /// goes with a Content-Length, as a single buffer did).
    pub(crate) fn into_request_body(self) -> reqwest::Body {
        let length = (self.text.len() + self.last_line.len()) as u64;
        let mut chunks = VecDeque::with_capacity(2);
        if !self.text.is_empty() {
            chunks.push_back(Bytes::from_owner(SharedText(self.text)));
        }
        if !self.last_line.is_empty() {
            chunks.push_back(Bytes::from(self.last_line));
        }
        reqwest::Body::wrap(Chunks { chunks, remaining: length })
    }
}

impl From<Arc<str>> for ConfigBody {
    fn from(text: Arc<str>) -> Self {
        Self { text, last_line: String::new() }
    }
}

impl From<String> for ConfigBody {
    fn from(text: String) -> Self {
        Self::from(Arc::<str>::from(text))
    }
}

impl From<&str> for ConfigBody {
    fn from(text: &str) -> Self {
        Self::from(Arc::<str>::from(text))
    }
}

impl From<&String> for ConfigBody {
    fn from(text: &String) -> Self {
        Self::from(text.as_str())
    }
}

/// A shared text as the owner of the bytes a chunk sends.
struct SharedText(Arc<str>);

impl AsRef<[u8]> for SharedText {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// Chunks sent one after the other, each let go once taken.
struct Chunks {
    chunks: VecDeque<Bytes>,
    remaining: u64,
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let next = self.chunks.pop_front();
        if let Some(chunk) = &next {
            self.remaining = self.remaining.saturating_sub(chunk.len() as u64);
        }
        Poll::Ready(next.map(|chunk| Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body sent is the text and its last line, in order, of the length announced; the
    /// text itself is the render's, not a copy.
    #[tokio::test]
    async fn the_body_is_the_shared_text_then_the_last_line() {
        use http_body_util::BodyExt;

        let text: Arc<str> = Arc::from("global\n    maxconn 10");
        let body = ConfigBody::with_last_line(text.clone(), "# rendered abc\n");
        assert_eq!(body.to_text(), "global\n    maxconn 10\n# rendered abc\n");
        let mut chunks = VecDeque::new();
        chunks.push_back(Bytes::from_owner(SharedText(text.clone())));
        assert_eq!(Arc::strong_count(&text), 3, "the chunk holds the render's text, not a copy");
        drop(chunks);
        let request = body.clone().with_a_newline().into_request_body();
        assert_eq!(http_body::Body::size_hint(&request).exact(), Some(body.to_text().len() as u64));
        let sent = request.collect().await.map(|collected| collected.to_bytes());
        assert_eq!(sent.ok().as_deref(), Some(body.to_text().as_bytes()));
    }

    /// The body goes with a Content-Length, as one buffer did (not chunked), and whole.
    #[tokio::test]
    async fn the_body_goes_with_its_length() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let body = ConfigBody::with_last_line(Arc::from("global\n    maxconn 10\n"), "# rendered abc\n");
        let expected = body.to_text();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut received = Vec::new();
            let mut buffer = [0u8; 4096];
            while !String::from_utf8_lossy(&received).contains("# rendered abc\n") {
                let read = socket.read(&mut buffer).await.unwrap();
                assert!(read > 0, "the connection closed early");
                received.extend_from_slice(&buffer[..read]);
            }
            socket.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n").await.unwrap();
            String::from_utf8(received).unwrap()
        });
        let client = reqwest::Client::new();
        let answer = client.post(format!("http://{address}/raw")).body(body.into_request_body()).send().await.unwrap();
        assert_eq!(answer.status(), 204);
        let request = server.await.unwrap();
        let (head, sent) = request.split_once("\r\n\r\n").unwrap();
        assert!(head.to_ascii_lowercase().contains(&format!("content-length: {}", expected.len())), "{head}");
        assert!(!head.to_ascii_lowercase().contains("transfer-encoding"), "{head}");
        assert_eq!(sent, expected);
    }

    /// A body without any newline gets one at its end, and only such a body.
    #[test]
    fn a_body_without_a_newline_gets_one() {
        assert_eq!(ConfigBody::from("global").with_a_newline().to_text(), "global\n");
        assert_eq!(ConfigBody::from("global\n    maxconn 1").with_a_newline().to_text(), "global\n    maxconn 1");
        assert_eq!(ConfigBody::with_last_line(Arc::from(""), "# x").with_a_newline().to_text(), "# x\n");
    }
}
