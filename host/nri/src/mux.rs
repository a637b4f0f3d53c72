//! The NRI socket's multiplexer: two byte streams share one Unix connection, each chunk of one sent as a frame with
//! an 8-byte header, the stream's connection id and the chunk's length (both big-endian `u32`).
//!
//! Connection 1 carries the plugin's service (the runtime is its client), connection 2 the runtime's (the plugin
//! is its client). Id 0 is reserved. A chunk is at most one ttrpc message's worth ([`MAX_PAYLOAD`]); a longer write
//! is split, and a reader reassembles by stream, never by frame ([`crate::ttrpc::Assembler`]).

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::ttrpc;

/// The connection the runtime calls the plugin's service on.
pub const PLUGIN_SERVICE: u32 = 1;
/// The connection the plugin calls the runtime's service on.
pub const RUNTIME_SERVICE: u32 = 2;

const HEADER: usize = 8;
/// The largest chunk a frame carries: one ttrpc message, its header included.
pub const MAX_PAYLOAD: usize = ttrpc::HEADER + ttrpc::MAX_DATA;

/// Reads one frame: its connection id and payload. `None` when the peer closed the socket between frames; a
/// socket closed inside a frame, a reserved id or an oversized length is an error.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<(u32, Vec<u8>)>> {
    let mut header = [0u8; HEADER];
    match r.read_exact(&mut header[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    r.read_exact(&mut header[1..]).await?;
    let conn = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
    if conn == 0 {
        return Err(invalid("a frame on the reserved connection 0".into()));
    }
    if len > MAX_PAYLOAD {
        return Err(invalid(format!(
            "a frame of {len} bytes on connection {conn}, over the {MAX_PAYLOAD} bytes one may carry"
        )));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok(Some((conn, payload)))
}

/// Writes `bytes` on connection `conn`, in as many frames as it takes.
pub async fn write_frames<W: AsyncWrite + Unpin>(
    w: &mut W,
    conn: u32,
    bytes: &[u8],
) -> io::Result<()> {
    let mut out = Vec::with_capacity(bytes.len() + HEADER);
    for chunk in bytes.chunks(MAX_PAYLOAD) {
        out.clear();
        out.extend_from_slice(&conn.to_be_bytes());
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
        w.write_all(&out).await?;
    }
    w.flush().await
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_long_write_is_split_into_frames_and_read_back_in_order() {
        let bytes: Vec<u8> = (0..MAX_PAYLOAD + 100).map(|i| i as u8).collect();
        let mut wire = Vec::new();
        write_frames(&mut wire, RUNTIME_SERVICE, &bytes)
            .await
            .unwrap();
        assert_eq!(wire.len(), bytes.len() + 2 * HEADER);
        let mut r = wire.as_slice();
        let (c1, p1) = read_frame(&mut r).await.unwrap().unwrap();
        let (c2, p2) = read_frame(&mut r).await.unwrap().unwrap();
        assert_eq!((c1, c2), (RUNTIME_SERVICE, RUNTIME_SERVICE));
        assert_eq!((p1.len(), p2.len()), (MAX_PAYLOAD, 100));
        assert_eq!([p1, p2].concat(), bytes);
        assert!(read_frame(&mut r).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn frames_that_break_the_rules_are_errors() {
        let frame = |conn: u32, len: u32, body: usize| {
            [conn.to_be_bytes(), len.to_be_bytes()]
                .concat()
                .into_iter()
                .chain(vec![0; body])
                .collect::<Vec<u8>>()
        };
        let err = |wire: Vec<u8>| async move {
            read_frame(&mut wire.as_slice())
                .await
                .unwrap_err()
                .to_string()
        };
        assert!(err(frame(0, 1, 1)).await.contains("reserved connection 0"));
        assert!(err(frame(1, MAX_PAYLOAD as u32 + 1, 0))
            .await
            .contains("over the"));
        // Closed inside a frame: its header, or its payload.
        assert_eq!(err(frame(1, 4, 0)[..5].to_vec()).await, "early eof");
        assert_eq!(err(frame(1, 4, 2)).await, "early eof");
    }
}
