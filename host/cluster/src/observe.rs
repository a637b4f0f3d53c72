//! Counting the API requests a client sends: a tower layer under kube's client that tells an observer the
//! Kubernetes verb and resource of each request and the status code of its answer (`None`: no answer, because
//! the connection failed or the caller gave up, e.g. at its timeout).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Told of every request: `(verb, resource, code)`, e.g. `("patch", "pods/status", Some(200))`.
pub type RequestObserver = Arc<dyn Fn(&str, &str, Option<u16>) + Send + Sync>;

/// The verb and resource of a request to the Kubernetes API, from its method and path: `get`, `list`,
/// `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`; the resource's plural with its
/// subresource (`pods/status`), or `other` for a path that is not a resource (`/version`).
pub fn classify(method: &http::Method, uri: &http::Uri) -> (&'static str, String) {
    let segs: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let rest: &[&str] = match segs.first() {
        Some(&"api") if segs.len() >= 2 => &segs[2..],
        Some(&"apis") if segs.len() >= 3 => &segs[3..],
        _ => &[],
    };
    let rest = match rest {
        ["namespaces", _ns, more @ ..] if !more.is_empty() => more,
        other => other,
    };
    let (resource, named) = match rest {
        [] => ("other".to_string(), false),
        [r] => (r.to_string(), false),
        [r, _name] => (r.to_string(), true),
        [r, _name, sub, ..] => (format!("{r}/{sub}"), true),
    };
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

#[derive(Clone)]
pub struct ObserveLayer(pub RequestObserver);

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observe<S>;
    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            observer: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    observer: RequestObserver,
}

/// Reports `None` if dropped before the answer came (the caller's timeout).
struct Pending {
    observer: RequestObserver,
    verb: &'static str,
    resource: String,
    done: bool,
}

impl Pending {
    fn finish(&mut self, code: Option<u16>) {
        if !self.done {
            self.done = true;
            (self.observer)(self.verb, &self.resource, code);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.finish(None);
    }
}

impl<S, ReqB, ResB> tower::Service<http::Request<ReqB>> for Observe<S>
where
    S: tower::Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        let (verb, resource) = classify(req.method(), req.uri());
        let mut pending = Pending {
            observer: self.observer.clone(),
            verb,
            resource,
            done: false,
        };
        let answer = self.inner.call(req);
        Box::pin(async move {
            let result = answer.await;
            pending.finish(result.as_ref().ok().map(|r| r.status().as_u16()));
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(method: http::Method, uri: &str) -> (&'static str, String) {
        classify(&method, &uri.parse().unwrap())
    }

    #[test]
    fn verbs_and_resources_of_the_requests_plexus_sends() {
        use http::Method as M;
        assert_eq!(
            c(M::GET, "/api/v1/namespaces/ns/pods/p"),
            ("get", "pods".into())
        );
        assert_eq!(
            c(M::GET, "/api/v1/pods?fieldSelector=spec.nodeName%3Dn"),
            ("list", "pods".into())
        );
        assert_eq!(
            c(
                M::GET,
                "/api/v1/pods?fieldSelector=x&watch=true&resourceVersion=5"
            ),
            ("watch", "pods".into())
        );
        assert_eq!(
            c(M::PATCH, "/api/v1/namespaces/ns/pods/p/status"),
            ("patch", "pods/status".into())
        );
        assert_eq!(
            c(M::POST, "/api/v1/namespaces/ns/events"),
            ("create", "events".into())
        );
        assert_eq!(
            c(
                M::GET,
                "/apis/k8s.cni.cncf.io/v1/namespaces/ns/network-attachment-definitions/n"
            ),
            ("get", "network-attachment-definitions".into())
        );
        assert_eq!(
            c(
                M::GET,
                "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions?watch=1"
            ),
            ("watch", "network-attachment-definitions".into())
        );
        assert_eq!(
            c(
                M::PATCH,
                "/apis/plexus.dev/v1alpha1/networkhooks/h/status?fieldManager=x"
            ),
            ("patch", "networkhooks/status".into())
        );
        assert_eq!(
            c(M::GET, "/api/v1/namespaces/ns"),
            ("get", "namespaces".into())
        );
        assert_eq!(c(M::GET, "/version"), ("list", "other".into()));
        assert_eq!(
            c(M::DELETE, "/api/v1/namespaces/ns/pods"),
            ("deletecollection", "pods".into())
        );
    }
}
