//! Answers of the API bounded per object, not per stream.
//!
//! A watch is a stream of events, one JSON document a line, open for minutes; a list page is one JSON document
//! whose `items` are the objects. Bounding either as a whole cuts a watch after so many bytes whatever their
//! objects, and fails a list whose page is large although each object is small: one namespace's user could keep
//! every node's cache unsynced with a few large NADs. Instead each object is bounded: a watch event over
//! [`MAX_OBJECT_BYTES`], or an element of a list's `items` over it, is left out (logged with its name, counted
//! in [`skipped_objects`]) and the rest of the answer goes on. What is not an item (a single object's answer, a
//! list's envelope) stays bounded by [`super::MAX_RESPONSE_BYTES`].
//!
//! Leaving out is not enough for a watch: an update or delete over the bound would leave the cache holding the
//! version before it. So a watch event over the bound, of a kind the node daemon caches ([`EVICTED_KINDS`]), is
//! replaced by a DELETED event of the object's name and resourceVersion alone: the cache drops the object, and a
//! later ADD that needs it reads it by name (and gets the current version, or the refusal of its size).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};

/// The largest object kept from a list or a watch. etcd refuses a write over 1.5 MiB by default, so no object
/// of a cluster with default limits comes near it; a NAD, or a pod's metadata, is a few KiB.
pub const MAX_OBJECT_BYTES: usize = 1 << 20;
/// What the items of one list answer may take in total: past it, further items are left out (counted and
/// logged like an item over the bound; a cache that misses one reads it by name). A list "at any version" is
/// served whole from the API server's cache, whatever its page size, so without it one namespace's objects would
/// pass through the node's memory all at once.
pub const MAX_LIST_ITEMS_BYTES: usize = 32 << 20;
/// Items over [`LARGE_ITEM_BYTES`] take at most this much of it, so that a few namespaces' large objects cannot
/// crowd out everyone's small ones.
pub const MAX_LARGE_ITEMS_BYTES: usize = 8 << 20;
/// An item larger than this counts against [`MAX_LARGE_ITEMS_BYTES`] too (an ordinary NAD is a few KiB).
pub const LARGE_ITEM_BYTES: usize = 64 << 10;
/// Items left out of one answer for its total that are logged by name; the rest are counted.
const LOGGED_OVER_TOTAL: u32 = 10;

/// How much of a skipped list item is kept to name it in the log.
const HEAD_BYTES: usize = 4096;
/// How much of a skipped watch event is kept to evict its object: its metadata whole, annotations (at most 256 KiB
/// in Kubernetes) and all, since a custom resource's metadata keys come sorted, `annotations` before `name`.
const EVENT_HEAD_BYTES: usize = 512 << 10;
/// The kinds whose watch events over the bound become DELETED events of their name (the node daemon's caches).
/// Their types read an object of metadata alone; a kind whose `spec` is required would not.
pub const EVICTED_KINDS: [&str; 2] = ["Pod", "NetworkAttachmentDefinition"];

static SKIPPED: AtomicU64 = AtomicU64::new(0);

/// Objects left out of lists and watches for their size, since the process started.
pub fn skipped_objects() -> u64 {
    SKIPPED.load(Ordering::Relaxed)
}

/// How an answer is read: a watch's lines, or one JSON document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Lines,
    Json,
}

impl Mode {
    /// A watch (`watch=true` or `watch=1` in the query) is read as lines.
    pub(crate) fn of(uri: &http::Uri) -> Mode {
        let watch = uri.query().is_some_and(|q| {
            q.split('&')
                .any(|p| p == "watch=true" || p == "watch=1" || p == "watch")
        });
        if watch {
            Mode::Lines
        } else {
            Mode::Json
        }
    }
}

/// The filter over an answer's bytes.
#[derive(Debug)]
pub(crate) struct Scanner {
    mode: Mode,
    limit: usize,
    envelope_limit: usize,
    /// The object being read (a line, or an element of `items`), up to `limit`.
    object: Vec<u8>,
    /// Past `limit`: its first bytes, to name it; the rest is dropped until it ends.
    skipping: Option<Vec<u8>>,
    // JSON state.
    depth: u32,
    in_string: bool,
    escape: bool,
    /// The key being read at depth 1, and the last one read there.
    key: Option<Vec<u8>>,
    last_key: Vec<u8>,
    in_items: bool,
    in_item: bool,
    items_written: usize,
    envelope: usize,
    /// Bytes of the items written, of the large ones among them, and items left out for the total.
    items_bytes: usize,
    large_items_bytes: usize,
    over_total: u32,
}

/// An answer over its bound outside its items.
#[derive(Debug, thiserror::Error)]
#[error("the answer is over {0} bytes outside its list items")]
pub struct TooLarge(usize);

impl Scanner {
    pub(crate) fn new(mode: Mode, limit: usize, envelope_limit: usize) -> Scanner {
        Scanner {
            mode,
            limit,
            envelope_limit,
            object: Vec::new(),
            skipping: None,
            depth: 0,
            in_string: false,
            escape: false,
            key: None,
            last_key: Vec::new(),
            in_items: false,
            in_item: false,
            items_written: 0,
            envelope: 0,
            items_bytes: 0,
            large_items_bytes: 0,
            over_total: 0,
        }
    }

    /// Filters `input` into `out`.
    pub(crate) fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), TooLarge> {
        match self.mode {
            Mode::Lines => {
                self.feed_lines(input, out);
                Ok(())
            }
            Mode::Json => input.iter().try_for_each(|&b| self.json_byte(b, out)),
        }
    }

    /// The end of the answer: a last line without its newline goes out as it is.
    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) {
        if self.mode == Mode::Lines {
            match self.skipping.take() {
                Some(head) => {
                    skipped(&head);
                    out.extend(eviction(&head).unwrap_or_default());
                }
                None => out.append(&mut self.object),
            }
        }
    }

    fn keep(&mut self, bytes: &[u8]) {
        let head_bytes = match self.mode {
            Mode::Lines => EVENT_HEAD_BYTES,
            Mode::Json => HEAD_BYTES,
        };
        match &mut self.skipping {
            Some(head) => {
                let room = head_bytes.saturating_sub(head.len());
                head.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            None if self.object.len() + bytes.len() > self.limit => {
                let mut head = std::mem::take(&mut self.object);
                head.truncate(head_bytes);
                let room = head_bytes.saturating_sub(head.len());
                head.extend_from_slice(&bytes[..bytes.len().min(room)]);
                self.skipping = Some(head);
            }
            None => self.object.extend_from_slice(bytes),
        }
    }

    fn feed_lines(&mut self, mut input: &[u8], out: &mut Vec<u8>) {
        while let Some(end) = input.iter().position(|&b| b == b'\n') {
            self.keep(&input[..end]);
            match self.skipping.take() {
                Some(head) => {
                    skipped(&head);
                    if let Some(stub) = eviction(&head) {
                        out.extend_from_slice(&stub);
                        out.push(b'\n');
                    }
                }
                None => {
                    out.append(&mut self.object);
                    out.push(b'\n');
                }
            }
            self.object.clear();
            input = &input[end + 1..];
        }
        self.keep(input);
    }

    fn json_byte(&mut self, b: u8, out: &mut Vec<u8>) -> Result<(), TooLarge> {
        let string_byte = self.in_string;
        if self.in_string {
            if self.escape {
                self.escape = false;
            } else if b == b'\\' {
                self.escape = true;
            } else if b == b'"' {
                self.in_string = false;
            }
        } else {
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
        }
        if self.in_items {
            return self.items_byte(b, string_byte, out);
        }
        self.track_key(b, string_byte);
        if b == b'[' && !string_byte && self.depth == 2 && self.last_key == b"items" {
            self.in_items = true;
        }
        self.envelope += 1;
        if self.envelope > self.envelope_limit {
            return Err(TooLarge(self.envelope_limit));
        }
        out.push(b);
        Ok(())
    }

    /// The keys of the top-level object, to find `items`.
    fn track_key(&mut self, b: u8, string_byte: bool) {
        if self.depth != 1 {
            return;
        }
        match (&mut self.key, string_byte, self.in_string) {
            // A string opens at depth 1.
            (None, false, true) => self.key = Some(Vec::new()),
            // Its bytes, up to a key's length.
            (Some(k), true, true) if k.len() < 64 => k.push(b),
            // It closed: it is the last key read (or a value; a value is never followed by '[' at depth 1).
            (Some(_), true, false) => self.last_key = self.key.take().unwrap_or_default(),
            _ => {}
        }
    }

    /// Whether the item read (`object`) fits in what the answer's items may take in total.
    fn item_fits(&self) -> bool {
        let len = self.object.len();
        self.items_bytes + len <= MAX_LIST_ITEMS_BYTES
            && (len <= LARGE_ITEM_BYTES || self.large_items_bytes + len <= MAX_LARGE_ITEMS_BYTES)
    }

    fn items_byte(&mut self, b: u8, string_byte: bool, out: &mut Vec<u8>) -> Result<(), TooLarge> {
        if self.in_item {
            self.keep(&[b]);
            if !string_byte && self.depth == 2 && (b == b'}' || b == b']') {
                self.in_item = false;
                match self.skipping.take() {
                    Some(head) => skipped(&head),
                    None if !self.item_fits() => {
                        self.over_total += 1;
                        over_total(&self.object, self.over_total <= LOGGED_OVER_TOTAL);
                    }
                    None => {
                        if self.items_written > 0 {
                            out.push(b',');
                        }
                        self.items_bytes += self.object.len();
                        if self.object.len() > LARGE_ITEM_BYTES {
                            self.large_items_bytes += self.object.len();
                        }
                        out.append(&mut self.object);
                        self.items_written += 1;
                    }
                }
                self.object.clear();
            }
            return Ok(());
        }
        match b {
            // An element starts.
            b'{' | b'[' if self.depth == 3 => {
                self.in_item = true;
                self.keep(&[b]);
            }
            // The array ends.
            b']' if self.depth == 1 => {
                self.in_items = false;
                out.push(b);
            }
            // Separators and whitespace between elements: written anew.
            _ => {}
        }
        Ok(())
    }
}

/// The members of the JSON object that starts at `text[at]` (`{`), as (key, value) byte ranges of `text`, as far
/// as `text` holds them: a head of a document cut anywhere gives the members before the cut, and the one cut, to
/// the end of `text`.
fn members(text: &[u8], at: usize) -> Members<'_> {
    let mut out = Vec::new();
    if text.get(at) != Some(&b'{') {
        return out;
    }
    let mut i = at + 1;
    let skip_ws = |i: &mut usize| {
        while text
            .get(*i)
            .is_some_and(|b| b.is_ascii_whitespace() || *b == b',')
        {
            *i += 1;
        }
    };
    // The end of the JSON value that starts at `i` (one past it), if `text` holds all of it.
    let value_end = |mut i: usize| -> Option<usize> {
        let (mut depth, mut in_string, mut escape) = (0u32, false, false);
        let first = *text.get(i)?;
        if first != b'{' && first != b'[' && first != b'"' {
            // A number, true, false or null: up to the next separator.
            while text
                .get(i)
                .is_some_and(|b| !matches!(b, b',' | b'}' | b']'))
            {
                i += 1;
            }
            return (i < text.len()).then_some(i);
        }
        while let Some(&b) = text.get(i) {
            i += 1;
            if in_string {
                match (escape, b) {
                    (true, _) => escape = false,
                    (false, b'\\') => escape = true,
                    (false, b'"') => {
                        in_string = false;
                        if depth == 0 {
                            return Some(i);
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(i);
                    }
                }
                _ => {}
            }
        }
        None
    };
    loop {
        skip_ws(&mut i);
        if text.get(i) != Some(&b'"') {
            return out;
        }
        let Some(key_end) = value_end(i) else {
            return out;
        };
        let key = &text[i + 1..key_end - 1];
        i = key_end;
        while text
            .get(i)
            .is_some_and(|b| b.is_ascii_whitespace() || *b == b':')
        {
            i += 1;
        }
        let Some(end) = value_end(i) else {
            // Cut: the last member runs to the end of what there is (its start is what an object's caller needs).
            out.push((key, i..text.len()));
            return out;
        };
        out.push((key, i..end));
        i = end;
    }
}

/// A JSON object's members, as [`members`] reads them.
type Members<'t> = Vec<(&'t [u8], std::ops::Range<usize>)>;

/// What the first bytes of a piece of an answer say of its object: a watch event's `object`, or a list item
/// itself. Keys are found as members of their objects, not by searching the text: the API server writes a custom
/// resource's keys sorted, so its `annotations` (which may hold a key "name") come before its `name`.
struct Head<'h> {
    bytes: &'h [u8],
    /// The piece's own members: a watch event's `type` and `object`, or the item's.
    top: Members<'h>,
    object: Members<'h>,
    metadata: Members<'h>,
}

impl<'h> Head<'h> {
    fn of(bytes: &'h [u8]) -> Head<'h> {
        let top = members(bytes, 0);
        let object = match find(&top, "object") {
            Some(r) => members(bytes, r.start),
            None => top.clone(),
        };
        let metadata = find(&object, "metadata")
            .map(|r| members(bytes, r.start))
            .unwrap_or_default();
        Head {
            bytes,
            top,
            object,
            metadata,
        }
    }

    /// The string value of `key` among `of`, when the head holds it whole.
    fn string(&self, of: &Members<'_>, key: &str) -> Option<String> {
        serde_json::from_slice(&self.bytes[find(of, key)?]).ok()
    }

    fn kind(&self) -> Option<String> {
        self.string(&self.object, "kind")
    }

    fn meta(&self, key: &str) -> Option<String> {
        self.string(&self.metadata, key)
    }
}

/// The value of `key` among `of`.
fn find(of: &Members<'_>, key: &str) -> Option<std::ops::Range<usize>> {
    of.iter()
        .find(|(k, _)| *k == key.as_bytes())
        .map(|(_, r)| r.clone())
}

/// The DELETED event that stands for a watch event over the bound (see the module docs), from the event's first
/// bytes: `None` for a kind not in [`EVICTED_KINDS`], an event that is not an object's (BOOKMARK, ERROR), or a
/// head that does not hold the object's kind, apiVersion, name and resourceVersion.
fn eviction(head: &[u8]) -> Option<Vec<u8>> {
    let h = Head::of(head);
    let ty = h.string(&h.top, "type")?;
    if !matches!(ty.as_str(), "ADDED" | "MODIFIED" | "DELETED") {
        return None;
    }
    let kind = h.kind().filter(|k| EVICTED_KINDS.contains(&k.as_str()))?;
    let api_version = h.string(&h.object, "apiVersion")?;
    let mut metadata = serde_json::Map::new();
    for key in ["name", "namespace", "resourceVersion", "uid"] {
        if let Some(v) = h.meta(key) {
            metadata.insert(key.into(), v.into());
        }
    }
    if !metadata.contains_key("name") || !metadata.contains_key("resourceVersion") {
        return None;
    }
    let event = serde_json::json!({
        "type": "DELETED",
        "object": {"apiVersion": api_version, "kind": kind, "metadata": metadata},
    });
    serde_json::to_vec(&event).ok()
}

/// Counts (and logs, when `log`) a list item left out for the answer's total.
fn over_total(item: &[u8], log: bool) {
    SKIPPED.fetch_add(1, Ordering::Relaxed);
    if log {
        let h = Head::of(&item[..item.len().min(EVENT_HEAD_BYTES)]);
        tracing::warn!(
            bytes = item.len(),
            kind = %h.kind().unwrap_or_default(),
            namespace = %h.meta("namespace").unwrap_or_default(),
            name = %h.meta("name").unwrap_or_default(),
            total = MAX_LIST_ITEMS_BYTES,
            large = MAX_LARGE_ITEMS_BYTES,
            "a list item was left out: the answer's items are over what one answer may take (a cache that misses it reads it by name)"
        );
    }
}

/// Logs and counts an object left out for its size, named from its first bytes.
fn skipped(head: &[u8]) {
    SKIPPED.fetch_add(1, Ordering::Relaxed);
    let h = Head::of(head);
    tracing::warn!(
        kind = %h.kind().unwrap_or_default(),
        namespace = %h.meta("namespace").unwrap_or_default(),
        name = %h.meta("name").unwrap_or_default(),
        limit = MAX_OBJECT_BYTES,
        "an object over the size bound was left out of the answer (a cached one is dropped from the cache and read by name when needed)"
    );
}

/// A response body passed through a [`Scanner`].
pub struct BoundedBody<B> {
    inner: B,
    scanner: Scanner,
    done: bool,
}

impl<B> BoundedBody<B> {
    pub(crate) fn new(inner: B, mode: Mode) -> BoundedBody<B> {
        BoundedBody {
            inner,
            scanner: Scanner::new(mode, MAX_OBJECT_BYTES, super::MAX_RESPONSE_BYTES),
            done: false,
        }
    }
}

impl<B> Body for BoundedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<tower::BoxError>,
{
    type Data = Bytes;
    type Error = tower::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let mut out = Vec::new();
            match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        if let Err(e) = this.scanner.feed(&data, &mut out) {
                            this.done = true;
                            return Poll::Ready(Some(Err(Box::new(e))));
                        }
                    }
                    Err(other) => return Poll::Ready(Some(Ok(other))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    this.done = true;
                    this.scanner.finish(&mut out);
                }
            }
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
            }
        }
    }
}

/// The layer that bounds every answer of the client: watches by line, everything else as one JSON document
/// whose `items` are bounded each.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BoundLayer;

impl<S> tower::Layer<S> for BoundLayer {
    type Service = Bound<S>;
    fn layer(&self, inner: S) -> Bound<S> {
        Bound(inner)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Bound<S>(S);

impl<S, Req, Res> tower::Service<http::Request<Req>> for Bound<S>
where
    S: tower::Service<http::Request<Req>, Response = http::Response<Res>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<BoundedBody<Res>>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Req>) -> Self::Future {
        let mode = Mode::of(req.uri());
        let answer = self.0.call(req);
        Box::pin(async move {
            answer
                .await
                .map(|r| r.map(|body| BoundedBody::new(body, mode)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of a list answer's items.
    fn item_names(out: &str) -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(out).unwrap();
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }

    /// `input` through a scanner, fed in pieces of `step` bytes.
    fn run(mode: Mode, limit: usize, input: &str, step: usize) -> Result<String, TooLarge> {
        let mut s = Scanner::new(mode, limit, 1 << 20);
        let mut out = Vec::new();
        for piece in input.as_bytes().chunks(step) {
            s.feed(piece, &mut out)?;
        }
        s.finish(&mut out);
        Ok(String::from_utf8(out).unwrap())
    }

    fn nad(name: &str, config_len: usize) -> String {
        format!(
            r#"{{"kind":"NetworkAttachmentDefinition","metadata":{{"name":"{name}","namespace":"team"}},"spec":{{"config":"{}"}}}}"#,
            "x".repeat(config_len)
        )
    }

    #[test]
    fn a_list_loses_only_its_items_over_the_bound() {
        let list = format!(
            r#"{{"kind":"List","metadata":{{"resourceVersion":"7","continue":"c"}},"items":[{}, {},{} ]}}"#,
            nad("a", 10),
            nad("big", 500),
            nad("c", 10)
        );
        let before = skipped_objects();
        for step in [1, 7, list.len()] {
            let out = run(Mode::Json, 300, &list, step).unwrap();
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(item_names(&out), ["a", "c"], "step {step}: {out}");
            assert_eq!(v["metadata"]["continue"], "c");
        }
        assert!(skipped_objects() >= before + 3);
        // First and last elements, and every element: still a valid document.
        for items in [
            vec![nad("big", 500), nad("b", 1)],
            vec![nad("b", 1), nad("big", 500)],
            vec![nad("big", 500), nad("big2", 500)],
            vec![],
        ] {
            let list = format!(r#"{{"items":[{}],"kind":"List"}}"#, items.join(","));
            let out = run(Mode::Json, 300, &list, 3).unwrap();
            let v: serde_json::Value =
                serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
            assert!(v["items"].as_array().unwrap().len() <= 1, "{out}");
        }
    }

    #[test]
    fn strings_with_brackets_and_escapes_do_not_confuse_it() {
        let tricky = r#"{"metadata":{"name":"t"},"spec":{"config":"{\"a\": [1, \"]}\\\"\"]}"}}"#;
        let list = format!(r#"{{"items":[{tricky},{tricky}],"kind":"List","note":"items ["}}"#);
        let out = run(Mode::Json, 1 << 20, &list, 5).unwrap();
        assert_eq!(out, list);
        // A single object's answer passes whole; a key called items deeper down is not the list's.
        let object = r#"{"kind":"Pod","spec":{"items":[{"a":1}]}}"#;
        assert_eq!(run(Mode::Json, 4, object, 2).unwrap(), object);
    }

    #[test]
    fn a_large_answer_outside_its_items_is_refused() {
        let object = format!(r#"{{"kind":"Pod","x":"{}"}}"#, "y".repeat(100));
        let mut s = Scanner::new(Mode::Json, 1 << 20, 64);
        let mut out = Vec::new();
        let err = s.feed(object.as_bytes(), &mut out).unwrap_err();
        assert!(err.to_string().contains("over 64 bytes"), "{err}");
    }

    #[test]
    fn a_watch_loses_only_its_events_over_the_bound_and_is_never_cut() {
        let event =
            |name: &str, n: usize| format!(r#"{{"type":"ADDED","object":{}}}"#, nad(name, n));
        let mut stream = String::new();
        // Far more in total than any bound, an event at a time.
        for i in 0..200 {
            stream.push_str(&event(&format!("n{i}"), 100));
            stream.push('\n');
        }
        stream.push_str(&event("big", 5000));
        stream.push('\n');
        stream.push_str(&event("after", 1));
        let out = run(Mode::Lines, 1000, &stream, 333).unwrap();
        let names: Vec<String> = out
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(names.len(), 201);
        assert!(!names.contains(&"big".to_string()));
        assert_eq!(names.last().unwrap(), "after");
    }

    #[test]
    fn a_watch_event_over_the_bound_evicts_its_object_by_name() {
        // As the API server writes them: kind and apiVersion first, then metadata (name, namespace, ...).
        let event = |ty: &str, name: &str, n: usize| {
            format!(
                r#"{{"type":"{ty}","object":{{"kind":"NetworkAttachmentDefinition","apiVersion":"k8s.cni.cncf.io/v1","metadata":{{"name":"{name}","namespace":"team","resourceVersion":"42"}},"spec":{{"config":"{}"}}}}}}"#,
                "x".repeat(n)
            )
        };
        let stream = [
            event("ADDED", "small", 1),
            event("MODIFIED", "grown", 5000),
            event("DELETED", "gone", 5000),
            format!(
                r#"{{"type":"MODIFIED","object":{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{{"name":"s","resourceVersion":"43"}},"spec":{{"x":"{}"}}}}}}"#,
                "y".repeat(5000)
            ),
            // A custom resource as the API server writes it: keys sorted, annotations (one named "name") first.
            format!(
                r#"{{"object":{{"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition","metadata":{{"annotations":{{"name":"decoy","x":"{}"}},"name":"sorted","namespace":"team","resourceVersion":"44"}},"spec":{{"config":"{}"}}}},"type":"MODIFIED"}}"#,
                "a".repeat(2000),
                "x".repeat(5000)
            ),
            event("ADDED", "after", 1),
        ]
        .join("\n");
        let out = run(Mode::Lines, 1000, &stream, 97).unwrap();
        let events: Vec<(String, String, serde_json::Value)> = out
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                let meta = &v["object"]["metadata"];
                (
                    v["type"].as_str().unwrap().to_string(),
                    meta["name"].as_str().unwrap().to_string(),
                    meta.clone(),
                )
            })
            .collect();
        let summary: Vec<(&str, &str)> = events
            .iter()
            .map(|(t, n, _)| (t.as_str(), n.as_str()))
            .collect();
        assert_eq!(
            summary,
            [
                ("ADDED", "small"),
                ("DELETED", "grown"),
                ("DELETED", "gone"),
                ("DELETED", "sorted"),
                ("ADDED", "after")
            ],
            "the NAD updated or deleted over the bound is evicted; a slice (not cached that way) is left out"
        );
        assert_eq!(
            events[1].2,
            serde_json::json!({"name": "grown", "namespace": "team", "resourceVersion": "42"}),
            "its name and resourceVersion, so the watch resumes where it was"
        );
        // The stub reads as a NAD object.
        let stub: serde_json::Value = serde_json::from_str(out.lines().nth(1).unwrap()).unwrap();
        let nad: crate::kube::NadObject = serde_json::from_value(stub["object"].clone()).unwrap();
        assert_eq!(kube::Resource::meta(&nad).name.as_deref(), Some("grown"));
    }

    #[test]
    fn a_lists_items_are_bounded_in_total_large_ones_first() {
        // 100 large items (100 KiB each, 10 MiB) first, then 50 small ones: the large ones take at most their share, the
        // small ones all fit.
        let mut items: Vec<String> = (0..100)
            .map(|i| nad(&format!("big{i}"), 100 << 10))
            .collect();
        items.extend((0..50).map(|i| nad(&format!("small{i}"), 100)));
        let list = format!(r#"{{"kind":"List","items":[{}]}}"#, items.join(","));
        let out = run(Mode::Json, MAX_OBJECT_BYTES, &list, 8192).unwrap();
        let names = item_names(&out);
        let big = names.iter().filter(|n| n.starts_with("big")).count();
        assert_eq!(
            big,
            MAX_LARGE_ITEMS_BYTES / ((100 << 10) + 100),
            "{names:?}"
        );
        assert_eq!(names.iter().filter(|n| n.starts_with("small")).count(), 50);
    }

    #[test]
    fn a_real_servers_custom_resource_event_is_evicted() {
        // Longer than the head kept of a skipped event, as a NAD over the 1 MiB bound is.
        let config = serde_json::json!({"cniVersion": "1.0.0", "name": "grow",
            "padding": "x".repeat(EVENT_HEAD_BYTES + 1000)})
        .to_string();
        let event = serde_json::json!({"type": "MODIFIED", "object": {
            "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"creationTimestamp": "2026-11-28T00:05:14Z", "generation": 2,
                "managedFields": [{"apiVersion": "k8s.cni.cncf.io/v1", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {".": {}, "f:config": {}}}, "manager": "curl",
                    "operation": "Update", "time": "2026-11-28T00:05:14Z"}],
                "name": "grow", "namespace": "team-a", "resourceVersion": "345", "uid": "u-1"},
            "spec": {"config": config}}});
        let line = format!("{event}\n");
        let out = run(Mode::Lines, 1000, &line, 65536).unwrap();
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
        assert_eq!(v["type"], "DELETED");
        assert_eq!(v["object"]["metadata"]["name"], "grow");
    }

    #[test]
    fn watches_are_read_by_line() {
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        assert_eq!(
            Mode::of(&uri("/api/v1/pods?watch=true&resourceVersion=1")),
            Mode::Lines
        );
        assert_eq!(
            Mode::of(&uri("/api/v1/pods?fieldSelector=a&watch=1")),
            Mode::Lines
        );
        assert_eq!(Mode::of(&uri("/api/v1/pods?limit=500")), Mode::Json);
        assert_eq!(
            Mode::of(&uri("/api/v1/namespaces/a/pods/watch")),
            Mode::Json
        );
    }
}
